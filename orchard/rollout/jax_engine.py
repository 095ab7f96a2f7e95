"""``JaxEngine``: the in-process engine over :class:`~orchard.rollout.sampler.Sampler`.

It shares the learner's process and devices, so a weight update is a pointer swap: the next
``generate`` uses the new parameters and nothing is recompiled (same architecture, same shapes).

With a tokenizer it also returns text and applies stop strings. Stop strings are checked after
decoding: the completion is cut after the first token whose text completes a stop string, which
is what a sampler that checked every step would have returned (the same tokens, since sampling is
seeded per step), at the cost of the tokens decoded past it.
"""

from __future__ import annotations

from collections.abc import Sequence

from jax.sharding import Mesh

from orchard.data.tokenizer import Tokenizer
from orchard.models import from_pretrained
from orchard.models.transformer import Transformer
from orchard.rollout.sampler import Completion, Sampler, SamplingParams


class JaxEngine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer | None = None) -> None:
        self.sampler = Sampler(model)
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, path: str, mesh: Mesh | None = None, tokenizer: Tokenizer | None = None,
                        **overrides) -> JaxEngine:
        return cls(from_pretrained(path, mesh=mesh, **overrides), tokenizer)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: JaxEngine(model, tokenizer=...)")
        completions = self.sampler.generate([list(p) for p in prompts], sampling)
        if self.tokenizer is None:
            return completions
        return [self._finish(c, sampling.stop) for c in completions]

    def _finish(self, completion: Completion, stops: tuple[str, ...]) -> Completion:
        """Add the text; cut at the first stop string (the text ends before it, the tokens include it)."""
        decode = self.tokenizer.decode
        text = decode(completion.token_ids)
        found = [(index, index + len(stop)) for stop in stops if (index := text.find(stop)) >= 0]
        if not found:
            return Completion(completion.token_ids, completion.logprobs, completion.finish_reason, text)
        start, end = min(found)
        # The fewest tokens whose text reaches the end of the stop string (prefix texts only grow).
        low, high = 1, len(completion.token_ids)
        while low < high:
            middle = (low + high) // 2
            if len(decode(completion.token_ids[:middle])) >= end:
                high = middle
            else:
                low = middle + 1
        return Completion(completion.token_ids[:low], completion.logprobs[:low], "stop", text[:start])

    def update_weights(self, model: Transformer) -> None:
        if model.cfg != self.sampler.cfg:
            raise ValueError("update_weights needs a model of the same architecture and dtype policy")
        self.sampler.update(model)
