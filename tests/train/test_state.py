"""The shared training step: frozen parameters (a VLM's vision tower and mergers) do not move."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard.models import VisionLanguageModel, VLMConfig
from orchard.models.pixels import ImageProcessing, patchify
from orchard.models.sharding import make_mesh
from orchard.models.vlm import vision_inputs
from orchard.train.state import (
    OptimConfig,
    frozen_labels,
    init_state,
    make_optimizer,
    make_train_step,
    target_logprobs,
)

CFG = VLMConfig.tiny(vocab_size=32, image_token_id=29, vision_start_token_id=30, vision_end_token_id=31,
                     vision={"patch_size": 4, "num_position_embeddings": 16})


def _flat(params) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(path, simple=True, separator="."): np.asarray(value)
            for path, value in jax.tree_util.tree_leaves_with_path(params)}


def _train_one_step(frozen: tuple[str, ...]) -> tuple[dict, dict]:
    model = VisionLanguageModel(CFG, rngs=nnx.Rngs(0))
    image = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    patches, grid = patchify(image, CFG.vision, ImageProcessing(min_pixels=64))
    tokens = np.asarray([[1, 2, 30, 29, 29, 29, 29, 31, 3, 4]], np.int32)
    positions, images, _ = vision_inputs(tokens, [[(patches, grid)]], CFG)

    def loss_fn(graphdef, params, batch):
        logits = nnx.merge(graphdef, params)(batch["tokens"], batch["positions"], images=images)
        nll = -target_logprobs(logits[:, :-1], batch["tokens"][:, 1:])
        return jnp.sum(nll), jnp.asarray(nll.size, jnp.float32)

    optimizer, schedule = make_optimizer(OptimConfig(peak_lr=1e-2, warmup_steps=1, weight_decay=0.1,
                                                     frozen=frozen), total_steps=4)
    graphdef, state = init_state(model, optimizer, make_mesh())
    before = _flat(state.params)
    step = make_train_step(graphdef, optimizer, schedule, loss_fn)
    state, _ = step(state, {"tokens": jnp.asarray(tokens)[None], "positions": jnp.asarray(positions)[None]})
    return before, _flat(state.params)


@pytest.mark.parametrize("frozen", [(), ("model.visual",)])
def test_frozen_parameters_do_not_move_and_the_rest_trains(frozen):
    before, after = _train_one_step(frozen)
    moved = {name for name in before if not np.array_equal(before[name], after[name])}
    vision = {name for name in before if name.startswith("model.visual.")}
    assert vision and moved - vision, "the language model must train"
    if frozen:
        assert not moved & vision
    else:  # without freezing, the image reaches the tower's every part (DeepStack mergers included)
        assert vision <= moved


def test_a_frozen_prefix_that_names_nothing_is_an_error():
    params = nnx.state(VisionLanguageModel(CFG, rngs=nnx.Rngs(0)), nnx.Param)
    labels = frozen_labels(params, ("model.visual.merger",))
    assert set(jax.tree.leaves(labels)) == {"frozen", "trained"}
    with pytest.raises(ValueError, match="match no parameter"):
        frozen_labels(params, ("model.vision",))
