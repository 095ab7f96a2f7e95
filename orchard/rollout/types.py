"""The rollout wire types: what goes into an engine and what comes out. No JAX, no Flax.

Harnesses, the proxy and HTTP-only engines import these without the JAX stack installed; the
in-process sampler (:mod:`orchard.rollout.sampler`) uses the same types.

:class:`Weights` is what a trainer hands an engine in ``update_weights``: the parameters (for an
engine in the same process, which serves them as they are) and a way to write them as a Hugging
Face checkpoint (for an engine in another process, which reloads them from disk or over a
transfer channel), with a version number that every completion sampled afterwards reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

MAX_TOP_LOGPROBS = 20
Alternatives = list[list[tuple[int, float]]]  # per token: the (token id, logprob) of the most likely ones
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings: applied by engines that have a tokenizer
    seed: int = 0
    top_logprobs: int = 0  # also return the k most likely tokens of every step, with their logprobs

    def __post_init__(self) -> None:
        if (self.max_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0
                or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"invalid sampling parameters: {self}")


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str | None = None  # set by engines that have a tokenizer
    alternatives: Alternatives | None = None  # with SamplingParams.top_logprobs
    weight_version: int | None = None  # the version of the weights that sampled it, when the engine knows


@dataclass(frozen=True)
class StreamDelta:
    """New tokens for one row of the batch since the last delta."""

    row: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None  # set on the row's last delta
    text: str | None = None  # set by engines that have a tokenizer
    alternatives: Alternatives | None = None  # with SamplingParams.top_logprobs
    weight_version: int | None = None  # the version of the weights that sampled it, when the engine knows


class Weights(Protocol):
    """A policy's weights as a trainer hands them to an engine."""

    version: int  # increases with every update; completions report the version that sampled them

    @property
    def params(self) -> Any:
        """The parameters as a pytree of arrays, for an engine in the trainer's own process."""
        ...

    def save_pretrained(self, directory: str, dtype: str | None = None) -> None:
        """Write ``config.json`` and safetensors into ``directory``, for an engine that reloads them, cast
        to ``dtype`` (the dtype the engine serves, e.g. ``"bfloat16"``; ``None``: the parameters' own)."""
        ...
