"""The rollout-engine contract: token ids in, token ids (with logprobs) out, and weight updates.

Harnesses and the RL loop talk to every engine through this protocol: the in-process
:class:`~orchard.rollout.jax_engine.JaxEngine`, and :class:`~orchard.rollout.openai_engine.OpenAIEngine`
over any OpenAI-compatible server (``orchard serve``, vLLM). Token ids flow end to end, so
nothing is ever re-tokenised to be trained on. This module and its types
(:mod:`orchard.rollout.types`) import neither JAX nor Flax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from orchard.rollout.types import Completion, SamplingParams, Weights


class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        """One completion per prompt (token ids, their logprobs, and why generation stopped)."""
        ...

    def update_weights(self, weights: Weights) -> None:
        """Serve ``weights`` from the next call on."""
        ...
