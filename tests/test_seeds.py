"""The one seed formula: pure, stable, different for different things, and the only way the package seeds
a random generator."""

from __future__ import annotations

import pathlib
import re

import pytest

from orchard.seeds import SEED_BITS, derive_seed, episode_seed, seeded_random, turn_seed

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "orchard"


def test_seeds_are_pure_functions_of_what_they_seed():
    assert episode_seed(0, 3, "opkit__swap-1", 2) == episode_seed(0, 3, "opkit__swap-1", 2)
    seeds = {episode_seed(run, step, task, sample) for run in (0, 1) for step in (0, 1, "eval")
             for task in ("a", "b") for sample in range(4)}
    assert len(seeds) == 2 * 3 * 2 * 4  # every coordinate matters
    assert episode_seed(0, 1, "a", 0) != episode_seed(0, "1", "a", 0)  # an int step is not a string step
    assert all(0 <= s < 2**SEED_BITS for s in seeds)
    assert turn_seed(0, 5, 0) != turn_seed(0, 5, 1) != turn_seed(1, 5, 1)
    assert derive_seed(7, "prompts", 2) == 1880287000  # stable across runs and machines (a fixed hash)


def test_two_purposes_never_share_a_stream():
    purposes = ["split/held-out", "split/held-out-helpers", "split/rl-prompts", "split/sft-eval", "prompts",
                "select", "model-init", "sft-batches", "swe-generate", "swe-oracle", "claw-generate", "episode"]
    for run_seed in (0, 1, 7):
        draws = {purpose: seeded_random(run_seed, purpose).random() for purpose in purposes}
        assert len(set(draws.values())) == len(purposes)
    # what changes the stream: the run seed, the purpose, each part; a run seed is never a part of another purpose
    assert derive_seed(1, "a") != derive_seed(0, "a") != derive_seed(0, "b") != derive_seed(0, "a", 1)
    assert derive_seed(0, "a", 1) != derive_seed(1, "a", 0)
    assert seeded_random(3, "x", "y").random() == seeded_random(3, "x", "y").random()


def test_the_argument_order_is_enforced():
    with pytest.raises(TypeError, match="run seed is an int"):
        derive_seed("gui-shop", 3)  # the purpose first: the order an earlier call site had
    with pytest.raises(TypeError, match="purpose is a non-empty string"):
        derive_seed(3, 4)
    with pytest.raises(TypeError, match="ints or strings"):
        derive_seed(0, "a", 1.5)
    with pytest.raises(TypeError, match="run seed is an int"):
        derive_seed(True, "a")


def test_nothing_in_the_package_seeds_a_generator_of_its_own():
    """Every draw goes through orchard.seeds: no other module builds a random.Random or a NumPy generator
    from a seed, and no seed is offset by a constant (``seed + 1``) to make a second stream."""
    pattern = re.compile(r"random\.Random\(|default_rng\(|RandomState\(|\bseed \+ \d|\bseed\+\d")
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
                 for path in PACKAGE.rglob("*.py") if path.name != "seeds.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
