"""``JaxEngine``: the in-process engine over :class:`~orchard.rollout.sampler.Sampler`.

It shares the learner's process and devices, so a weight update is a pointer swap: the next
``generate`` uses the new parameters and nothing is recompiled (same architecture, same shapes).
"""

from __future__ import annotations

from collections.abc import Sequence

from jax.sharding import Mesh

from orchard.models import from_pretrained
from orchard.models.transformer import Transformer
from orchard.rollout.sampler import Completion, Sampler, SamplingParams


class JaxEngine:
    def __init__(self, model: Transformer) -> None:
        self.sampler = Sampler(model)

    @classmethod
    def from_pretrained(cls, path: str, mesh: Mesh | None = None, **overrides) -> JaxEngine:
        return cls(from_pretrained(path, mesh=mesh, **overrides))

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
        return self.sampler.generate([list(p) for p in prompts], sampling)

    def update_weights(self, model: Transformer) -> None:
        if model.cfg != self.sampler.cfg:
            raise ValueError("update_weights needs a model of the same architecture and dtype policy")
        self.sampler.update(model)
