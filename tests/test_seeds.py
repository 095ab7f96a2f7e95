"""The one seed formula: pure, stable, and different for different things."""

from __future__ import annotations

import pytest

from orchard.harness.seeds import SEED_BITS, derive_seed, episode_seed, turn_seed


def test_seeds_are_pure_functions_of_what_they_seed():
    assert episode_seed(0, 3, "opkit__swap-1", 2) == episode_seed(0, 3, "opkit__swap-1", 2)
    seeds = {episode_seed(run, step, task, sample) for run in (0, 1) for step in (0, 1, "eval")
             for task in ("a", "b") for sample in range(4)}
    assert len(seeds) == 2 * 3 * 2 * 4  # every coordinate matters
    assert episode_seed(0, 1, "a", 0) != episode_seed(0, "1", "a", 0)  # an int step is not a string step
    assert all(0 <= s < 2**SEED_BITS for s in seeds)
    assert turn_seed(0, 5, 0) != turn_seed(0, 5, 1) != turn_seed(1, 5, 1)
    assert derive_seed(7, "prompts", 2) == 1880287000  # stable across runs and machines (a fixed hash)


def test_bad_parts_are_refused():
    with pytest.raises(ValueError, match="at least one part"):
        derive_seed()
    with pytest.raises(TypeError, match="ints or strings"):
        derive_seed(0, 1.5)
    with pytest.raises(TypeError, match="ints or strings"):
        derive_seed(True)
