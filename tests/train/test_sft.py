"""The SFT trainer: sharded steps equal unsharded ones, a killed run resumes identically, the loss falls."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from benchmarks.sft import write_examples
from orchard.config import from_config, to_dict
from orchard.models import ModelConfig, Transformer
from orchard.models.sharding import make_mesh, shard_bytes
from orchard.train.metrics import read_metrics
from orchard.train.sft import SFTConfig, train_and_evaluate
from orchard.train.state import OptimConfig, batch_sharding, init_state, make_optimizer, make_train_step
from orchard.workdir import StaleStage

OPTIM = OptimConfig(1e-2, 1e-3, 2, 0.01, 1.0)
B1, B2 = 0.9, 0.95  # AdamW's moment decays
EPS32 = float(np.finfo(np.float32).eps)
# The most |m| / sqrt(v) (bias-corrected moments) can be at AdamW's first step, 1, or second, 1.00036:
# Cauchy-Schwarz over the weights the moments give the two gradients.
U_MAX = 1.0004

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


def _adam(state: Any) -> optax.ScaleByAdamState:
    """The AdamW moments in a train state's optimizer state."""
    return next(s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
                if isinstance(s, optax.ScaleByAdamState))


def _assert_within(actual: np.ndarray, desired: np.ndarray, bound: np.ndarray, what: str) -> None:
    excess = np.abs(np.asarray(actual, np.float64) - desired) - bound
    assert np.all(excess <= 0), f"{what}: {np.sum(excess > 0)} of {excess.size} elements beyond the bound, worst by {excess.max():.3g}"


def test_a_sharded_step_equals_the_unsharded_step():
    """Each of two AdamW steps, from the same state on one device and on a 4x2 mesh, makes the same new
    state, to within what summing the gradients in another order can change (plus a few float32 ulps).

    Each weight's gradient sums over the 512 tokens of the batch, and a float32 sum of n terms taken in
    another order moves by about eps sqrt(n) of its magnitude: we allow d = 8 eps sqrt(512), 2.2e-5, of
    the tensor's largest gradient, through the moments mu (by (1 - b1) d) and nu (by (1 - b2) (2 |g| d +
    d^2)). Not relative to each element: one whose gradient cancels to near zero has no bounded relative
    error. A lost shard or a missing all-reduce is off by a quarter of the gradient.

    AdamW moves a parameter by lr (m / sqrt(v) + wd p) (bias-corrected moments, Adam's eps aside), and
    |m| / sqrt(v) <= U_MAX. Gradients that differ by d move m by at most d and sqrt(v), a weighted norm of
    the gradients, by at most d, so m / sqrt(v) moves by at most (1 + U_MAX) d / (sqrt(v) - d), and never by
    more than 2 U_MAX: an element whose gradient is far above d moves the same to a small fraction of lr,
    one whose gradient is rounding noise may step the other way. A misplaced update is off by about lr in
    most elements, one with a 1% wrong learning rate by 240 times this bound (tried; the unchanged code
    stays under a tenth of each bound)."""
    optimizer, schedule = make_optimizer(OPTIM, 10, B1, B2)
    data = batch(rows=8, seq=32)
    tokens = data["tokens"].size
    layouts = []
    for mesh in (make_mesh(1, 1), make_mesh(4, 2)):
        graphdef, state = init_state(small_model(), optimizer, mesh)
        layouts.append((make_train_step(graphdef, optimizer, schedule), jax.tree.map(lambda x: x.sharding, state),
                        jax.device_put(data, batch_sharding(mesh))))
    before = jax.tree.map(np.asarray, state)  # both meshes start from the same values
    for t in (1, 2):
        (single, single_metrics), (sharded, sharded_metrics) = (
            step(jax.device_put(before, shardings), placed) for step, shardings, placed in layouts)
        np.testing.assert_allclose(float(sharded_metrics["loss"]), float(single_metrics["loss"]), rtol=1e-5)
        lr = float(schedule(t - 1))
        old, new, other = _adam(before), _adam(single), _adam(sharded)
        paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(before.params)]
        tensors = (old.mu, new.mu, new.nu, other.mu, other.nu, before.params, single.params, sharded.params)
        for path, mu0, mu, nu, mu_b, nu_b, p0, p, p_b in zip(
                paths, *([np.asarray(x, np.float64) for x in jax.tree.leaves(tree)] for tree in tensors), strict=True):
            what = f"step {t}, {path}"
            g = (mu - B1 * mu0) / (1 - B1)  # this step's gradient (after clipping), on one device
            d = 8 * EPS32 * np.sqrt(tokens) * np.abs(g).max()
            _assert_within(mu_b, mu, (1 - B1) * d + EPS32 * (B1 * np.abs(mu0) + (1 - B1) * np.abs(g) + np.abs(mu)),
                           f"{what}: mu")
            _assert_within(nu_b, nu, (1 - B2) * (2 * np.abs(g) * d + d**2) + 4 * EPS32 * nu, f"{what}: nu")
            ulps = 2 * EPS32 * (np.abs(p) + 4 * lr)
            # AdamW's step is at most lr (U_MAX + wd |p|), the premise of the bound below
            _assert_within(p, p0, lr * (U_MAX + OPTIM.weight_decay * np.abs(p0)) + ulps, f"{what}: one-device step")
            root_v = np.sqrt(nu / (1 - B2**t))
            moved = np.where(root_v > d, (1 + U_MAX) * d / np.maximum(root_v - d, 1e-30), np.inf)
            _assert_within(p_b, p, lr * np.minimum(moved, 2 * U_MAX) + ulps, f"{what}: parameters")
        before = jax.tree.map(np.asarray, single)
    embed = sharded.params["model"]["embed_tokens"]["weight"].get_value()
    assert shard_bytes(embed) * 8 == embed.nbytes  # vocab over tp=2, embed over fsdp=4
    mu = jax.tree.leaves(sharded.opt_state)
    assert any(getattr(leaf, "shape", ()) == embed.shape and shard_bytes(leaf) * 8 == leaf.nbytes for leaf in mu)


def config_for(tmp_path, num_steps: int = 24) -> tuple[SFTConfig, dict]:
    """A small SFT config and the example files it trains on."""
    config = from_config(SFTConfig, {"num_steps": num_steps, "log_every": 1, "eval_every": 6, "checkpoint_every": 6,
                                     "seq_len": 64, "batch_size": 4, "grad_accum": 2,
                                     "model": {"init": SMALL}, "optim": {"peak_lr": 1e-2, "warmup_steps": 3}})
    data = {"examples": write_examples(str(tmp_path / "train.jsonl"), 120, vocab_size=256),
            "eval_examples": write_examples(str(tmp_path / "eval.jsonl"), 16, vocab_size=256, seed=1)}
    return config, data


def test_a_killed_run_resumes_with_the_same_loss_curve(tmp_path):
    config, data = config_for(tmp_path)
    reference = str(tmp_path / "reference")
    train_and_evaluate(config, reference, **data)

    killed = str(tmp_path / "killed")
    script = textwrap.dedent(f"""
        import os, signal
        from orchard.config import from_config
        from orchard.train import metrics, sft
        config = from_config(sft.SFTConfig, {to_dict(config)!r})
        write = metrics.MetricsWriter.write
        def write_then_die(self, step, values):
            write(self, step, values)
            if step == 15:  # after the checkpoint at 12, before the one at 18
                os.kill(os.getpid(), signal.SIGKILL)
        metrics.MetricsWriter.write = write_then_die
        sft.train_and_evaluate(config, {killed!r}, **{data!r})
    """)
    process = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), capture_output=True, text=True,
                             timeout=600)
    assert process.returncode == -9, process.stderr[-2000:]
    saved = sorted(int(name) for name in os.listdir(os.path.join(killed, "checkpoints")))
    assert saved[-1] == 12 and len(read_metrics(killed)) == 15  # killed after step 15, last saved at 12
    train_and_evaluate(config, killed, **data)  # the restart

    expected, resumed = read_metrics(reference), read_metrics(killed)
    assert sorted(resumed) == sorted(expected) == list(range(1, 25))
    for step in expected:
        for name in ("loss", "grad_norm", "lr", "tokens"):
            assert resumed[step][name] == pytest.approx(expected[step][name], rel=1e-6, abs=1e-7), (step, name)
    assert resumed[24]["eval_loss"] == pytest.approx(expected[24]["eval_loss"], rel=1e-6)
    assert os.path.exists(os.path.join(killed, "model", "config.json"))
    # Done: a rerun returns the recorded metrics; other settings or other examples are refused.
    assert train_and_evaluate(config, killed, **data)["loss"] == expected[24]["loss"]
    with pytest.raises(StaleStage, match=r"num_steps: 24 -> 30"):
        train_and_evaluate(config_for(tmp_path, 30)[0], killed, **data)
    other = {**data, "examples": write_examples(str(tmp_path / "other.jsonl"), 120, vocab_size=256, seed=5)}
    with pytest.raises(StaleStage, match="inputs changed: examples"):
        train_and_evaluate(config, killed, **other)


def test_what_rows_cut_is_logged_and_kept_in_the_summary(tmp_path, caplog):
    from orchard.data.pipeline import truncation

    config, data = config_for(tmp_path, num_steps=1)
    config = from_config(SFTConfig, {**to_dict(config), "seq_len": 8, "grad_accum": 1})
    expected = truncation(data["examples"], 8)
    assert expected.truncated > 0
    summary = train_and_evaluate(config, str(tmp_path / "run"), examples=data["examples"])
    assert summary["truncated_examples"] == expected.truncated
    assert summary["trained_tokens_cut"] == pytest.approx(expected.cut_share)
    assert f"{expected.truncated} of {expected.scanned} examples are longer than seq_len + 1 = 9 tokens" in caplog.text


def test_the_loss_falls_on_the_synthetic_swe_data(tmp_path):
    """A fresh tiny model on real text: credit-assignment examples of the synthetic bug-fix set, in a BPE of at
    most 1,024 tokens trained on its trajectories, as the recipes train theirs (886: the text holds no more merges)."""
    from orchard.data.tokenizer import Tokenizer
    from orchard.recipes.sft_data import ExamplesConfig, build_examples, synthetic_trajectories

    texts = [m.content for t in synthetic_trajectories(8, 0, 0.05) for m in t.messages if m.content]
    tokenizer = Tokenizer.train(texts, 1024)
    train, held_out = build_examples(ExamplesConfig(synthetic_tasks=8), str(tmp_path / "data"), tokenizer)
    config = from_config(SFTConfig, {"num_steps": 24, "log_every": 1, "eval_every": 24, "batch_size": 1,
                                     "model": {"init": {**ModelConfig.preset_fields("tiny"), "hidden_size": 32,
                                                        "intermediate_size": 64}},
                                     "optim": {"peak_lr": 1e-2, "final_lr": 1e-3, "warmup_steps": 4}})
    train_and_evaluate(config, str(tmp_path / "run"), examples=train, eval_examples=held_out,
                       vocab_size=tokenizer.vocab_size)
    metrics = read_metrics(str(tmp_path / "run"))
    first, last = np.mean([metrics[s]["loss"] for s in (1, 2, 3)]), np.mean([metrics[s]["loss"] for s in (22, 23, 24)])
    assert first > 6.0 and last < first - 2.0  # from ln(886) = 6.8 towards the data
    assert metrics[24]["eval_loss"] < first - 2.0  # held-out tasks too


def test_bf16_compute_keeps_fp32_parameters():
    optimizer, schedule = make_optimizer(OPTIM, 10)
    mesh, data = make_mesh(1, 1), batch(rows=4, seq=32)
    losses = {}
    for dtype in ("float32", "bfloat16"):
        model = Transformer(ModelConfig(**SMALL, dtype=dtype, param_dtype="float32"), rngs=nnx.Rngs(0))
        graphdef, state = init_state(model, optimizer, mesh)
        state, metrics = make_train_step(graphdef, optimizer, schedule)(state, jax.device_put(data, batch_sharding(mesh)))
        assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {np.dtype("float32")}
        losses[dtype] = float(metrics["loss"])
    assert np.isfinite(losses["bfloat16"]) and losses["bfloat16"] == pytest.approx(losses["float32"], rel=2e-2)
