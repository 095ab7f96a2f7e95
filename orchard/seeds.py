"""The project's one seed formula: every random draw is a pure function of the run seed, what it is for,
and what it is drawn about.

Every seed in Orchard is ``derive_seed(run_seed, purpose, *parts)``, always in that order: the run's seed
(an int), a name for the draw's purpose (``"split/held-out"``, ``"prompts"``, ``"claw-generate"``...), and
the coordinates that tell its draws apart (a step, a task id, a sample index). Two purposes never share a
stream, and no draw depends on the order in which episodes start or finish, so a rerun with the same
config samples the same tasks, splits and rollouts at any concurrency. :func:`seeded_random` is the one
way to get a ``random.Random``; nothing else in the package seeds one itself (``tests/test_seeds.py``).

An episode's seed is :func:`episode_seed` of (run seed, step, task id, sample); each turn of an episode
samples with :func:`turn_seed`, so turns do not share a random stream.

This module sits at the package's top, below every layer, so any of them can use it.
"""

from __future__ import annotations

import hashlib
import random

SEED_BITS = 31  # JAX's PRNG keys and vLLM's seeds take non-negative 32-bit integers


def derive_seed(run_seed: int, purpose: str, *parts: int | str) -> int:
    """A seed in ``[0, 2**31)`` for the draw ``purpose`` of the run seeded ``run_seed``, told apart by
    ``parts`` (ints and strings); stable across runs and machines."""
    if not isinstance(run_seed, int) or isinstance(run_seed, bool):
        raise TypeError(f"a run seed is an int, not {type(run_seed).__name__}: {run_seed!r} (derive_seed(run_seed, "
                        "purpose, *parts))")
    if not isinstance(purpose, str) or not purpose:
        raise TypeError(f"a seed's purpose is a non-empty string, got {purpose!r} (derive_seed(run_seed, purpose, "
                        "*parts))")
    for part in parts:
        if not isinstance(part, int | str) or isinstance(part, bool):
            raise TypeError(f"seed parts are ints or strings, not {type(part).__name__}: {part!r}")
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in (run_seed, purpose, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") % 2**SEED_BITS


def seeded_random(run_seed: int, purpose: str, *parts: int | str) -> random.Random:
    """A ``random.Random`` seeded by :func:`derive_seed` (the project's only way to make one)."""
    return random.Random(derive_seed(run_seed, purpose, *parts))


def episode_seed(run_seed: int, step: int | str, prompt: str, sample: int) -> int:
    """The seed of sample ``sample`` of ``prompt`` (a task id) at ``step`` (an RL step, or a name
    such as ``"eval"``) of the run seeded ``run_seed``."""
    return derive_seed(run_seed, "episode", step, prompt, sample)


def turn_seed(policy_seed: int, episode: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` of an episode seeded ``episode``, for a policy seeded ``policy_seed``."""
    return derive_seed(policy_seed, "turn", episode, turn)
