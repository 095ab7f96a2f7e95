"""Packed rows with images: packing keeps each example's images with its tokens, and a packed row's
logits equal each example's logits alone (the same image in two examples, blank padding images)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard.data.pipeline import pack
from orchard.data.vision_rows import IMAGE_FEATURES, image_features
from orchard.models import VisionLanguageModel, VLMConfig
from orchard.models.pixels import ImageProcessing, patchify
from orchard.models.vlm import vision_inputs
from orchard.train.images import attach_images, batch_logits

CFG = VLMConfig.tiny(vocab_size=32, image_token_id=29, vision_start_token_id=30, vision_end_token_id=31,
                     vision={"patch_size": 4, "num_position_embeddings": 16}, text={"dtype": "float32"})
PAD = [29] * 4  # a 16 x 16 image: 4 x 4 patches merged 2 x 2
EXAMPLES = [([1, 2, 30, *PAD, 31, 3, 4], 0), ([5, 30, *PAD, 31, 6, 7, 8], 1), ([9, 30, *PAD, 31, 10], 0)]


@pytest.fixture(scope="module")
def setup():
    model = VisionLanguageModel(CFG, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    table = [patchify(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), CFG.vision, ImageProcessing(min_pixels=64))
             for _ in range(2)]
    examples = [{"token_ids": ids, "loss_mask": [1] * len(ids), **image_features(ids, [image], [table[image][1]], CFG)}
                for ids, image in EXAMPLES]
    return model, table, examples


def _packed(examples, images_per_row, table):
    [row] = pack(examples, seq_len=32, num_packing_bins=1, inputs=IMAGE_FEATURES)
    batch = {k: v[None] for k, v in row.items()}  # one row
    return attach_images(batch, lambda i: table[i][0], table[0][1], tokens_per_image=4, images_per_row=images_per_row)


def test_features_mark_each_placeholder_with_its_image(setup):
    _, _, examples = setup
    assert examples[1]["image_ids"] == [0, 0, 2, 2, 2, 2, 0, 0, 0, 0]  # image 1, stored as 1 + its index
    assert examples[0]["positions_h"] == [0, 1, 2, 3, 3, 4, 4, 5, 6, 7]  # the image's rows, then text resumes


@pytest.mark.parametrize("images_per_row", [3, 4])
def test_a_packed_row_gives_each_example_its_own_logits(setup, images_per_row):
    model, table, examples = setup
    batch = _packed(examples, images_per_row, table)
    assert batch["patches"].shape == (1, images_per_row * 16, CFG.vision.patch_values)
    logits = np.asarray(batch_logits(model, {k: jnp.asarray(v) for k, v in batch.items()}, table[0][1]))
    start = 0
    for ids, image in EXAMPLES:
        inputs = np.asarray([ids[:-1]], np.int32)
        positions, images, _ = vision_inputs(inputs, [[table[image]]], CFG)
        alone = np.asarray(model(jnp.asarray(inputs), jnp.asarray(positions), images=images))
        np.testing.assert_allclose(logits[0, start:start + len(ids) - 1], alone[0], rtol=1e-5, atol=1e-5)
        start += len(ids) - 1


def test_a_row_with_more_images_than_room_is_an_error(setup):
    _, table, examples = setup
    with pytest.raises(ValueError, match="holds 3 images"):
        _packed(examples, 2, table)


def test_an_image_token_sampled_as_text_is_not_taken_for_an_image(setup):
    """A completion may contain the image token; with the placeholders' known start it stays text."""
    _, table, _ = setup
    ids = [1, 30, *PAD, 31, 3, 29, 4]  # the policy sampled token 29 after the image
    features = image_features(ids, [0], [table[0][1]], CFG, starts=[2])
    assert features["image_ids"] == [0, 0, 1, 1, 1, 1, 0, 0, 0, 0]
    assert features["positions_t"][-3:] == [5, 6, 7]  # text resumes after the 2 x 2 image, the stray token included
    with pytest.raises(ValueError, match="more image tokens"):  # scanning cannot tell it apart
        image_features(ids, [0], [table[0][1]], CFG)
