"""Qwen3-VL against transformers: a tiny random ``Qwen3VLForConditionalGeneration`` (made by
``tests/fixtures/models/make_fixtures.py qwen3_vl``), its image processor, positions, logits and greedy
generation, with one and with two images in a prompt."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchard.models import VisionLanguageModel, VLMConfig, from_pretrained, save_pretrained
from orchard.models.pixels import ImageProcessing, patchify, smart_resize
from orchard.models.vlm import mrope_positions, vision_inputs

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models", "qwen3_vl")
PROCESSING = ImageProcessing(min_pixels=64, max_pixels=64 * 64)  # the fixture's preprocessor_config.json


@pytest.fixture(scope="module")
def expected():
    return np.load(os.path.join(FIXTURE, "expected.npz"))


@pytest.fixture(scope="module")
def model():
    return from_pretrained(FIXTURE, dtype="float32")


@nnx.jit
def _logits(model, tokens, positions, images):
    """One compiled forward pass per prompt shape (eager dispatch of every op took ~5 s a test)."""
    return model(tokens, positions, images=images)


def _images(expected, model, count):
    return [patchify(expected[f"image_{i}"], model.config.vision, PROCESSING) for i in range(count)]


def test_config_reads_the_checkpoint(model):
    cfg = model.config
    assert isinstance(model, VisionLanguageModel)
    assert cfg.text.mrope_section == (4, 2, 2) and cfg.text.qk_norm and not cfg.text.tie_word_embeddings
    assert cfg.vision.deepstack_visual_indexes == (0, 1) and cfg.vision.factor == 8
    assert (cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id) == (100, 101, 102)
    assert cfg.processing == PROCESSING  # read from preprocessor_config.json


def test_patches_equal_the_image_processor(expected, model):
    patches = np.concatenate([p for p, _ in _images(expected, model, 2)])
    np.testing.assert_allclose(patches, expected["pixel_values"], rtol=0, atol=1e-6)
    assert [list(g) for _, g in _images(expected, model, 2)] == expected["image_grid_thw"].tolist()


def test_resize_rule_and_resized_patches_equal_the_image_processor(expected, model):
    patches, grid = patchify(expected["resize_image"], model.config.vision, PROCESSING)  # 30 x 50 -> 32 x 48
    assert list(grid) == expected["resize_grid"][0].tolist()
    np.testing.assert_allclose(patches, expected["resize_pixel_values"], rtol=0, atol=1e-6)
    for (h, w), want in zip(expected["resize_cases"], expected["resized"], strict=True):
        assert smart_resize(int(h), int(w), 32, 64 * 32 * 32, 16384 * 32 * 32) == tuple(want)


@pytest.mark.parametrize("name,count", [("one", 1), ("two", 2)])
def test_logits_match_transformers(expected, model, name, count):
    tokens = expected[f"tokens_{name}"]
    positions, images, deltas = vision_inputs(tokens, [_images(expected, model, count)], model.config)
    np.testing.assert_array_equal(positions, expected[f"positions_{name}"])
    assert deltas.tolist() == expected[f"delta_{name}"].reshape(-1).tolist()
    logits = np.asarray(_logits(model, jnp.asarray(tokens), jnp.asarray(positions), images))
    np.testing.assert_allclose(logits, expected[f"logits_{name}"], rtol=1e-4, atol=1e-4)


def test_the_image_changes_the_logits(expected, model):
    """Guard against a test that passes without the tower: other pixels, other logits."""
    tokens = expected["tokens_one"]
    patches, grid = _images(expected, model, 1)[0]
    positions, images, _ = vision_inputs(tokens, [[(patches[::-1].copy(), grid)]], model.config)
    logits = np.asarray(_logits(model, jnp.asarray(tokens), jnp.asarray(positions), images))
    assert np.abs(logits - expected["logits_one"]).max() > 1e-2


def test_greedy_generation_with_an_image_equals_transformers(expected, model):
    """Decoding continues every axis from the prompt's largest position (its rotary delta). One
    compiled pass over a fixed length: the model is causal, so the slots not yet generated do not
    change the logits that pick the next token."""
    tokens = expected["tokens_one"]
    prompt, steps = tokens.shape[1], len(expected["greedy_one"])
    positions, images, deltas = vision_inputs(tokens, [_images(expected, model, 1)], model.config)
    new = np.arange(prompt, prompt + steps) + deltas[0]
    positions = jnp.asarray(np.concatenate([positions, np.broadcast_to(new, (3, 1, steps))], axis=2))
    logits_at = nnx.jit(lambda m, ids, at: m(ids, positions, images=images)[0, at])
    ids = np.concatenate([tokens, np.zeros((1, steps), np.int32)], axis=1)
    for step in range(steps):
        ids[0, prompt + step] = int(np.argmax(logits_at(model, jnp.asarray(ids), prompt + step - 1)))
    assert ids[0, prompt:].tolist() == expected["greedy_one"].tolist()


def test_text_only_positions_are_plain_rotary(model):
    tokens = jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32)
    flat = model(tokens)
    three = model(tokens, jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (3, 1, 6)))
    np.testing.assert_allclose(np.asarray(flat), np.asarray(three), rtol=1e-6, atol=1e-6)


def test_placeholders_that_do_not_fit_the_images_are_clear_errors(model, expected):
    cfg = model.config
    with pytest.raises(ValueError, match="needs 6 placeholder tokens"):
        mrope_positions(np.asarray([1, 101, 100, 100, 102]), [(1, 4, 6)], cfg)
    with pytest.raises(ValueError, match="more image tokens"):
        mrope_positions(np.asarray([1, 101, 100, 100, 100, 100, 102, 100]), [(1, 4, 4)], cfg)
    _, images, _ = vision_inputs(expected["tokens_one"], [_images(expected, model, 1)], cfg)
    with pytest.raises(ValueError, match="multimodal positions"):
        model(jnp.asarray(expected["tokens_one"]), images=images)


def test_save_pretrained_round_trips(model, expected, tmp_path):
    save_pretrained(model, str(tmp_path))
    assert VLMConfig.from_pretrained(str(tmp_path)) == VLMConfig.from_pretrained(FIXTURE)  # preprocessor too
    reloaded = from_pretrained(str(tmp_path), dtype="float32")
    tokens = expected["tokens_two"]
    positions, images, _ = vision_inputs(tokens, [_images(expected, model, 2)], model.config)
    logits = np.asarray(_logits(reloaded, jnp.asarray(tokens), jnp.asarray(positions), images))
    np.testing.assert_allclose(logits, expected["logits_two"], rtol=1e-4, atol=1e-4)
