"""A model built for its shapes only has the shapes, dtypes and logical axes of the model it stands for."""

from __future__ import annotations

import jax
import pytest
from flax import nnx

from orchard.models import ModelConfig, Transformer
from orchard.models.build import ModelSpec, build_model, tiny_vision_language
from orchard.models.params import model_shapes

MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "mlp_only_layers": (1,)}


def _described(model: nnx.Module) -> dict[str, tuple]:
    return {jax.tree_util.keystr(path): (variable.get_value().shape, variable.get_value().dtype,
                                         variable.get_metadata().get("logical_axes"))
            for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("init", [{**ModelConfig.preset_fields("tiny"), "param_dtype": "bfloat16"},
                                  {**ModelConfig.preset_fields("tiny"), **MOE}, tiny_vision_language()],
                         ids=["dense", "moe", "vision-language"])
def test_a_shapes_only_build_describes_the_built_model(init):
    spec, vision_tokens = ModelSpec(init=init), (61, 62, 63)  # a VLM's image, vision-start and vision-end ids
    built = build_model(spec, 0, vocab_size=64, vision_tokens=vision_tokens)
    shapes = build_model(spec, 0, vocab_size=64, vision_tokens=vision_tokens, shapes_only=True)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(nnx.state(shapes)))
    assert _described(shapes) == _described(built)
    assert len(_described(built)) > 10


def test_the_shapes_of_a_model_come_from_its_constructor():
    config = ModelConfig.tiny(vocab_size=32)
    shapes = model_shapes(lambda rngs: Transformer(config, rngs=rngs))
    assert _described(shapes) == _described(Transformer(config, rngs=nnx.Rngs(1)))


def test_a_checkpoint_is_not_built_for_its_shapes_only():
    with pytest.raises(ValueError, match="shapes_only builds a fresh model"):
        build_model(ModelSpec(path="smollm2"), 0, shapes_only=True)
