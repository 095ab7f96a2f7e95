"""The rollout-engine contract: token ids in, token ids (with logprobs) out, and weight updates.

Harnesses and the RL loop talk to every engine through this protocol: the in-process
:class:`~orchard.rollout.jax_engine.JaxEngine` here, OpenAI-compatible servers and vLLM later.
Token ids flow end to end, so nothing is ever re-tokenised to be trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from orchard.models.transformer import Transformer
from orchard.rollout.sampler import Completion, SamplingParams


class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        """One completion per prompt (token ids, their logprobs, and why generation stopped)."""
        ...

    def update_weights(self, model: Transformer) -> None:
        """Serve ``model``'s weights from the next call on."""
        ...
