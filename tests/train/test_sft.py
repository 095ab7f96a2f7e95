"""The SFT trainer: sharded steps equal unsharded ones, a killed run resumes identically, the loss falls."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from orchard.models import ModelConfig, Transformer
from orchard.models.sharding import make_mesh, shard_bytes
from orchard.train.bench import write_examples
from orchard.train.metrics import read_metrics
from orchard.train.sft import train_and_evaluate
from orchard.train.state import batch_sharding, init_state, make_optimizer, make_train_step

SMALL = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
         "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "qk_norm": True, "tie_word_embeddings": False,
         "max_position_embeddings": 512}


def small_model(seed: int = 0) -> Transformer:
    return Transformer(ModelConfig(**SMALL, dtype="float32"), rngs=nnx.Rngs(seed))


def batch(rows: int, seq: int, accumulation: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    shape = (accumulation, rows, seq)
    return {"tokens": rng.integers(0, 256, shape, dtype=np.int32), "targets": rng.integers(0, 256, shape, dtype=np.int32),
            "loss_mask": (rng.random(shape) < 0.7).astype(np.float32),
            "segment_ids": np.repeat(np.repeat(np.arange(1, 3, dtype=np.int32), seq // 2)[None, None], rows, 1)
            .repeat(accumulation, 0),
            "positions": np.tile(np.arange(seq // 2, dtype=np.int32), 2)[None, None].repeat(rows, 1).repeat(accumulation, 0)}


def test_a_sharded_step_equals_the_unsharded_step():
    optimizer, schedule = make_optimizer(1e-2, 1e-3, 2, 10, 0.01, 1.0)
    data = batch(rows=8, seq=32)
    results = []
    for mesh in (make_mesh(1, 1), make_mesh(4, 2)):
        graphdef, state = init_state(small_model(), optimizer, mesh)
        step = make_train_step(graphdef, optimizer, schedule)
        for _ in range(2):
            state, metrics = step(state, jax.device_put(data, batch_sharding(mesh)))
        results.append((state, metrics))
    (single, single_metrics), (sharded, sharded_metrics) = results
    np.testing.assert_allclose(float(sharded_metrics["loss"]), float(single_metrics["loss"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params), strict=True):
        # Adam divides by the gradient scale, so float reordering between layouts shows up at ~1e-6.
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-5)
    embed = sharded.params["model"]["embed_tokens"]["weight"].get_value()
    assert shard_bytes(embed) * 8 == embed.nbytes  # vocab over tp=2, embed over fsdp=4
    mu = jax.tree.leaves(sharded.opt_state)
    assert any(getattr(leaf, "shape", ()) == embed.shape and shard_bytes(leaf) * 8 == leaf.nbytes for leaf in mu)


def config_for(tmp_path, num_steps: int = 24):
    from ml_collections import ConfigDict

    from configs.swe_sft import get_config

    config = get_config("tiny")
    config.model.init = ConfigDict(SMALL)
    config.data.train = write_examples(str(tmp_path / "train.jsonl"), 120, vocab_size=256)
    config.data.eval = write_examples(str(tmp_path / "eval.jsonl"), 16, vocab_size=256, seed=1)
    config.data.seq_len, config.data.batch_size, config.data.grad_accum = 64, 4, 2
    config.num_steps, config.log_every, config.eval_every, config.checkpoint_every = num_steps, 1, 6, 6
    config.optim.peak_lr, config.optim.warmup_steps = 1e-2, 3
    return config


def test_a_killed_run_resumes_with_the_same_loss_curve(tmp_path):
    config = config_for(tmp_path)
    reference = str(tmp_path / "reference")
    train_and_evaluate(config, reference)

    killed = str(tmp_path / "killed")
    script = textwrap.dedent(f"""
        import os, signal, json
        from ml_collections import ConfigDict
        from orchard.train import metrics, sft
        config = ConfigDict(json.loads({config.to_json()!r}))
        write = metrics.MetricsWriter.write
        def write_then_die(self, step, values):
            write(self, step, values)
            if step == 15:  # after the checkpoint at 12, before the one at 18
                os.kill(os.getpid(), signal.SIGKILL)
        metrics.MetricsWriter.write = write_then_die
        sft.train_and_evaluate(config, {killed!r})
    """)
    process = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True, text=True,
                             timeout=600)
    assert process.returncode == -9, process.stderr[-2000:]
    saved = sorted(int(name) for name in os.listdir(os.path.join(killed, "checkpoints")))
    assert saved[-1] == 12 and len(read_metrics(killed)) == 15  # killed after step 15, last saved at 12
    train_and_evaluate(config, killed)  # the restart

    expected, resumed = read_metrics(reference), read_metrics(killed)
    assert sorted(resumed) == sorted(expected) == list(range(1, 25))
    for step in expected:
        for name in ("loss", "grad_norm", "lr", "tokens"):
            assert resumed[step][name] == pytest.approx(expected[step][name], rel=1e-6, abs=1e-7), (step, name)
    assert resumed[24]["eval_loss"] == pytest.approx(expected[24]["eval_loss"], rel=1e-6)


def test_the_loss_falls_on_the_synthetic_swe_data(tmp_path):
    """A fresh tiny model on real text: credit-assignment examples of the synthetic bug-fix set."""
    from configs.swe_sft import get_config
    from orchard.tasks.swe.sft_data import build_sft_data

    config = get_config("tiny")
    config.data.synthetic_tasks = 8
    config.data.train, config.data.eval = build_sft_data(config, str(tmp_path))
    config.model.init.hidden_size, config.model.init.intermediate_size = 32, 64
    config.data.batch_size, config.num_steps, config.log_every, config.eval_every = 1, 24, 1, 24
    config.optim.warmup_steps, config.optim.peak_lr = 4, 1e-2
    train_and_evaluate(config, str(tmp_path / "run"))
    metrics = read_metrics(str(tmp_path / "run"))
    first, last = np.mean([metrics[s]["loss"] for s in (1, 2, 3)]), np.mean([metrics[s]["loss"] for s in (22, 23, 24)])
    assert first > 10.0 and last < first - 2.0  # from ln(49152) = 10.8 towards the data
    assert metrics[24]["eval_loss"] < first - 2.0  # held-out tasks too


def test_bf16_compute_keeps_fp32_parameters():
    optimizer, schedule = make_optimizer(1e-2, 1e-3, 2, 10, 0.01, 1.0)
    mesh, data = make_mesh(1, 1), batch(rows=4, seq=32)
    losses = {}
    for dtype in ("float32", "bfloat16"):
        model = Transformer(ModelConfig(**SMALL, dtype=dtype, param_dtype="float32"), rngs=nnx.Rngs(0))
        graphdef, state = init_state(model, optimizer, mesh)
        state, metrics = make_train_step(graphdef, optimizer, schedule)(state, jax.device_put(data, batch_sharding(mesh)))
        assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {np.dtype("float32")}
        losses[dtype] = float(metrics["loss"])
    assert np.isfinite(losses["bfloat16"]) and losses["bfloat16"] == pytest.approx(losses["float32"], rel=2e-2)
