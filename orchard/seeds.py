"""The project's one seed formula: every seed is a pure function of what it is the seed of.

An episode's seed depends on (run seed, step, prompt, sample index) and nothing else, never on the
order in which episodes start or finish, so a rerun with the same config samples the same
rollouts at any concurrency. Each turn of an episode samples with :func:`turn_seed`, so turns do
not share a random stream. Callers name what a seed is for (``derive_seed(run_seed, "prompts",
step)``) so that two uses of the same numbers never collide.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 31  # JAX's PRNG keys and vLLM's seeds take non-negative 32-bit integers


def derive_seed(*parts: int | str) -> int:
    """A seed in ``[0, 2**31)`` from ``parts`` (ints and strings), stable across runs and machines."""
    if not parts:
        raise ValueError("derive_seed needs at least one part")
    for part in parts:
        if not isinstance(part, int | str) or isinstance(part, bool):
            raise TypeError(f"seed parts are ints or strings, not {type(part).__name__}: {part!r}")
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") % 2**SEED_BITS


def episode_seed(run_seed: int, step: int | str, prompt: str, sample: int) -> int:
    """The seed of sample ``sample`` of ``prompt`` (a task id) at ``step`` (an RL step, or a name
    such as ``"eval"``) of the run seeded ``run_seed``."""
    return derive_seed(run_seed, "episode", step, prompt, sample)


def turn_seed(policy_seed: int, episode: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` of an episode seeded ``episode``, for a policy seeded ``policy_seed``."""
    return derive_seed(policy_seed, "turn", episode, turn)
