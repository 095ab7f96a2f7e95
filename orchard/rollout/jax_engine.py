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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from jax.sharding import Mesh

from orchard.data.tokenizer import Tokenizer
from orchard.models import from_pretrained
from orchard.models.transformer import Transformer
from orchard.rollout.sampler import Sampler, collect
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


class JaxEngine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer | None = None) -> None:
        self.sampler = Sampler(model)
        self.tokenizer = tokenizer
        self.weight_version = 0

    @classmethod
    def from_pretrained(cls, path: str, mesh: Mesh | None = None, tokenizer: Tokenizer | None = None,
                        **overrides) -> JaxEngine:
        return cls(from_pretrained(path, mesh=mesh, **overrides), tokenizer)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        version = self.weight_version
        completions = collect(self.stream(prompts, sampling, chunk_tokens=sampling.max_tokens), len(prompts))
        return [dataclasses.replace(c, weight_version=version) for c in completions]

    def stream(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
               chunk_tokens: int = 1) -> Iterator[StreamDelta]:
        """Each row's new tokens (and text, with a tokenizer) as they are decoded."""
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: JaxEngine(model, tokenizer=...)")
        deltas = self.sampler.stream([list(p) for p in prompts], sampling, chunk_tokens)
        if self.tokenizer is None:
            yield from deltas
            return
        rows = [_Row() for _ in prompts]
        try:
            for delta in deltas:
                row = rows[delta.row]
                if row.finished:
                    continue
                row.token_ids += delta.token_ids
                row.logprobs += delta.logprobs
                row.alternatives += delta.alternatives or []
                yield self._advance(delta.row, row, delta.finish_reason, sampling.stop, sampling.top_logprobs > 0)
                if all(r.finished for r in rows):
                    return  # every row hit a stop string: stop decoding
        finally:
            deltas.close()

    def _advance(self, index: int, row: _Row, finish_reason: str | None, stops: Sequence[str],
                 alternatives: bool) -> StreamDelta:
        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

        text = decode(row.token_ids)
        found = [(at, at + len(stop)) for stop in stops
                 if (at := text.find(stop, max(0, row.sent_text - len(stop)))) >= 0]
        if found:
            start, end = min(found)
            # The fewest tokens whose text reaches the end of the stop string (prefix texts only grow).
            low, high = row.sent_tokens + 1, len(row.token_ids)
            while low < high:
                middle = (low + high) // 2
                if len(decode(row.token_ids[:middle])) >= end:
                    high = middle
                else:
                    low = middle + 1
            row.token_ids, row.logprobs, row.alternatives = row.token_ids[:low], row.logprobs[:low], row.alternatives[:low]
            text, finish_reason = text[:start], "stop"
        elif finish_reason is None:
            text = text[: len(text) - _held_back(text, stops)]
        row.finished = finish_reason is not None
        out = StreamDelta(index, row.token_ids[row.sent_tokens:], row.logprobs[row.sent_tokens:],
                          finish_reason, text[row.sent_text:],
                          row.alternatives[row.sent_tokens:] if alternatives else None)
        row.sent_tokens, row.sent_text = len(row.token_ids), max(row.sent_text, len(text))
        return out

    def update_weights(self, weights: Weights) -> None:
        """Serve ``weights.params`` from the next call on (same architecture; see ``Sampler.update``)."""
        self.sampler.update(weights.params)
        self.weight_version = weights.version
