"""The SFT benchmark's Orchard half runs and trains (no timing assertions; tunix is not needed)."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from benchmarks.sft import SftBenchConfig, build_model, make_batches, masked_next_token_loss, run_orchard
from orchard.train.state import token_losses

TINY = SftBenchConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=8, seq_len=32, batch_size=2, warmup=1, steps=2, repeats=1, examples=40)


def test_the_orchard_half_trains_and_reports_a_rate():
    result = run_orchard(TINY)
    assert result["tokens_per_s"] > 0 and result["rounds_tokens_per_s"] == [result["tokens_per_s"]]
    assert len(result["losses"]) == TINY.total_steps == 3
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert result["final_loss"] == result["losses"][-1]


def test_the_tunix_loss_is_orchards_loss():
    from flax import nnx

    batch = {k: jax.numpy.asarray(v) for k, v in make_batches(TINY, count=1)[0].items()}
    assert batch["tokens"].shape == (TINY.batch_size, TINY.seq_len) and float(batch["loss_mask"].sum()) > 0
    model = build_model(TINY)
    total, count = token_losses(*nnx.split(model, nnx.Param), batch)
    expected = float(total / count)
    assert float(masked_next_token_loss(model, **batch)) == pytest.approx(expected, rel=1e-6)
    assert np.isfinite(expected)
