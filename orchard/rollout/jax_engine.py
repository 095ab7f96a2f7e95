"""``JaxEngine``: the in-process engine over :class:`~orchard.rollout.sampler.Sampler`.

It shares the learner's process and devices, so a weight update is a pointer swap: the next
``generate`` uses the new parameters and nothing is recompiled (same architecture, same shapes).
Completions report the version of the weights that sampled them (0 until the first update).

With a tokenizer it also returns text (special tokens such as the end of turn left out, as vLLM
does) and applies stop strings, while streaming: text is released
as soon as it can no longer be the start of a stop string (or half of a UTF-8 character), and a
row ends at the token that completes a stop string. Its text ends before the stop string; its
tokens include that last token, which the model did sample. ``generate`` is ``stream`` collected,
with the whole budget decoded in one chunk, so a stop string there costs the tokens decoded past it.

Prompts with images (a vision-language model) decode in a batch of their own on the sampler even
when the engine has a continuous batcher: the batcher's rows carry no rotary deltas or image features.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from jax.sharding import Mesh

from orchard.data.chat import ChatFormat, make_chat_format
from orchard.data.tokenizer import Tokenizer
from orchard.models import from_pretrained
from orchard.models.pixels import image_tokens
from orchard.models.transformer import Transformer
from orchard.models.vlm import VLMConfig
from orchard.rollout.batching import ContinuousBatcher
from orchard.rollout.sampler import PromptImages, Sampler, collect
from orchard.rollout.types import Completion, SamplingParams, StreamDelta, Weights


@dataclass
class _Row:
    """One row's text state while streaming."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    alternatives: list = field(default_factory=list)
    sent_tokens: int = 0
    sent_text: int = 0
    finished: bool = False


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters to hold: a partial UTF-8 character, or a possible stop-string start."""
    hold = len(text) - len(text.rstrip("\ufffd"))
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                hold = max(hold, size)
                break
    return hold


def model_chat_format(name: str, tokenizer: Tokenizer, model: Transformer | VLMConfig) -> ChatFormat:
    """The chat format ``name`` over ``tokenizer``; for a vision-language ``model`` (or a
    :class:`~orchard.models.vlm.VLMConfig`), one that counts its images' placeholders as the model
    processes them."""
    config = model if isinstance(model, VLMConfig) else getattr(model, "config", None)
    if not isinstance(config, VLMConfig):
        return make_chat_format(name, tokenizer)
    return make_chat_format(name, tokenizer, lambda w, h: image_tokens(w, h, config.vision, config.processing))


class TextRows:
    """Turns a request's token deltas into text deltas, applying its stop strings (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, rows: int, sampling: SamplingParams) -> None:
        self.tokenizer, self.sampling = tokenizer, sampling
        self.rows = [_Row() for _ in range(rows)]

    @property
    def finished(self) -> bool:
        return all(row.finished for row in self.rows)

    def feed(self, delta: StreamDelta) -> StreamDelta | None:
        """The text delta for ``delta`` (``None`` for a row that already ended at a stop string)."""
        row = self.rows[delta.row]
        if row.finished:
            return None
        row.token_ids += delta.token_ids
        row.logprobs += delta.logprobs
        row.alternatives += delta.alternatives or []
        return self._advance(delta, row)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _advance(self, delta: StreamDelta, row: _Row) -> StreamDelta:
        stops, finish_reason = self.sampling.stop, delta.finish_reason
        text = self._decode(row.token_ids)
        found = [(at, at + len(stop)) for stop in stops
                 if (at := text.find(stop, max(0, row.sent_text - len(stop)))) >= 0]
        if found:
            start, end = min(found)
            # The fewest tokens whose text reaches the end of the stop string (prefix texts only grow).
            low, high = row.sent_tokens + 1, len(row.token_ids)
            while low < high:
                middle = (low + high) // 2
                if len(self._decode(row.token_ids[:middle])) >= end:
                    high = middle
                else:
                    low = middle + 1
            row.token_ids, row.logprobs, row.alternatives = row.token_ids[:low], row.logprobs[:low], row.alternatives[:low]
            text, finish_reason = text[:start], "stop"
        elif finish_reason is None:
            text = text[: len(text) - _held_back(text, stops)]
        row.finished = finish_reason is not None
        out = StreamDelta(delta.row, row.token_ids[row.sent_tokens:], row.logprobs[row.sent_tokens:],
                          finish_reason, text[row.sent_text:],
                          row.alternatives[row.sent_tokens:] if self.sampling.top_logprobs else None,
                          delta.weight_version)
        row.sent_tokens, row.sent_text = len(row.token_ids), max(row.sent_text, len(text))
        return out


class JaxEngine:
    """``max_batch_rows`` > 0: concurrent calls share decode steps in a
    :class:`~orchard.rollout.batching.ContinuousBatcher` of that many rows (what ``orchard serve``
    uses); 0: each call decodes its own batch (what the in-process RL loop uses). ``prefix_cache_bytes``:
    the sampler's prefix cache (:mod:`orchard.rollout.prefix_cache`) for those single-prompt calls."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer | None = None, max_batch_rows: int = 0,
                 chunk_steps: int = 2, prefix_cache_bytes: int = 0) -> None:
        self.sampler = Sampler(model, prefix_cache_bytes)
        self.tokenizer = tokenizer
        self.weight_version = 0
        # Without the batcher (which orders its own updates), generate and update_weights take turns: an
        # asynchronous RL learner syncs from its thread while episodes sample, and a completion (and the
        # prefix cache) must be of one version of the weights.
        self.batcher = ContinuousBatcher(self.sampler, max_batch_rows, chunk_steps) if max_batch_rows else None
        self._serving = threading.Lock() if self.batcher is None else contextlib.nullcontext()

    @classmethod
    def from_pretrained(cls, path: str, mesh: Mesh | None = None, tokenizer: Tokenizer | None = None,
                        **overrides) -> JaxEngine:
        return cls(from_pretrained(path, mesh=mesh, **overrides), tokenizer)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                 images: PromptImages | None = None) -> list[Completion]:
        """One completion per prompt; ``images`` (per prompt, uint8 ``[H, W, 3]`` arrays in the order of
        the prompt's image placeholders) for a vision-language model."""
        with self._serving:
            version = self.weight_version
            completions = collect(self.stream(prompts, sampling, chunk_tokens=sampling.max_tokens, images=images),
                                  len(prompts))
        return [c if c.weight_version is not None else dataclasses.replace(c, weight_version=version)
                for c in completions]

    def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
               chunk_tokens: int = 1, images: PromptImages | None = None) -> Iterator[StreamDelta]:
        """Each row's new tokens (and text, with a tokenizer) as they are decoded."""
        self._check_stops(sampling)
        prompts = [list(p) for p in prompts]
        deltas = (self.batcher.stream(prompts, sampling) if self.batcher is not None and not (images and any(images))
                  else self.sampler.stream(prompts, sampling, chunk_tokens, images=images))
        if self.tokenizer is None:
            yield from deltas
            return
        text = TextRows(self.tokenizer, len(prompts), sampling)
        try:
            for delta in deltas:
                if (out := text.feed(delta)) is not None:
                    yield out
                if text.finished:
                    return  # every row hit a stop string: stop decoding
        finally:
            deltas.close()

    async def astream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> AsyncIterator[StreamDelta]:
        """:meth:`stream` for the event loop, over the batcher (an engine built with ``max_batch_rows``)."""
        if self.batcher is None:
            raise RuntimeError("astream needs continuous batching: JaxEngine(..., max_batch_rows=N)")
        self._check_stops(sampling)
        prompts = [list(p) for p in prompts]
        deltas = self.batcher.astream(prompts, sampling)
        text = TextRows(self.tokenizer, len(prompts), sampling) if self.tokenizer is not None else None
        try:
            async for delta in deltas:
                out = delta if text is None else text.feed(delta)
                if out is not None:
                    yield out
                if text is not None and text.finished:
                    return
        finally:
            await deltas.aclose()

    async def agenerate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        """:meth:`generate` for the event loop (see :meth:`astream`)."""
        return collect([delta async for delta in self.astream(prompts, sampling)], len(prompts))

    def _check_stops(self, sampling: SamplingParams) -> None:
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: JaxEngine(model, tokenizer=...)")

    def update_weights(self, weights: Weights) -> None:
        """Serve ``weights.params`` from the next call on (same architecture; see ``Sampler.update``).
        With the batcher, this waits for the requests in flight to finish; without it, for the
        :meth:`generate` call in flight."""
        with self._serving:
            if self.batcher is not None:
                self.batcher.update(weights.params, weights.version)
            else:
                self.sampler.update(weights.params)
            self.weight_version = weights.version

    def close(self) -> None:
        """Stop the batcher's thread (requests still waiting get an error)."""
        if self.batcher is not None:
            self.batcher.close()
