"""The rollout-engine contract: token ids in, token ids (with logprobs) out, and weight updates.

Harnesses and the RL loop talk to every engine through this protocol: the in-process
:class:`~orchard.rollout.jax_engine.JaxEngine`, and :class:`~orchard.rollout.openai_engine.OpenAIEngine`
over any OpenAI-compatible server (``orchard serve``, vLLM). Token ids flow end to end, so
nothing is ever re-tokenised to be trained on. This module and its types
(:mod:`orchard.rollout.types`) import neither JAX nor Flax.

An engine may also have an async face, :class:`AsyncRolloutEngine`: ``agenerate``, a coroutine that
serves every call ``generate`` serves (images aside), declared by a true ``native_async``. Callers that
hold many episodes on one event loop (:class:`~orchard.harness.policies.EnginePolicy`) await it
instead of running ``generate`` in a thread each. ``OpenAIEngine`` declares it. ``JaxEngine`` does
not: its ``agenerate`` works only with a continuous batcher (``orchard serve`` checks for one), so
its callers run ``generate`` in threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from orchard.rollout.types import Completion, SamplingParams, Weights


class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        """One completion per prompt (token ids, their logprobs, and why generation stopped)."""
        ...

    def update_weights(self, weights: Weights) -> None:
        """Serve ``weights`` from the next call on."""
        ...


class AsyncRolloutEngine(RolloutEngine, Protocol):
    native_async: bool  # True: agenerate serves every call generate serves (images aside)

    async def agenerate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        """:meth:`generate` on the event loop."""
        ...


def has_native_async(engine: Any) -> bool:
    """Whether ``engine`` is an :class:`AsyncRolloutEngine` whose ``agenerate`` can stand in for ``generate``."""
    return getattr(engine, "native_async", False) is True and callable(getattr(engine, "agenerate", None))
