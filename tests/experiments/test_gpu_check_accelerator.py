"""The accelerator check (``experiments/gpu_check/accelerator.py``) at tiny shapes on the CPU: Orchard's sections
in process, and the runner's isolation (a section that fails is recorded, the rest still run). The PyTorch
sections need torch and transformers, which this environment does not install: there they must fail cleanly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.accelerator import (
    SIZES,
    attention,
    compare,
    greedy_parity,
    orchard_sampler,
    orchard_train,
    peak_flops,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = SIZES["tiny"]


@pytest.mark.slow
def test_orchard_s_train_step_runs_at_tiny_shapes_and_reports_throughput():
    result = orchard_train(replace(TINY, losses=("grpo",)), "")  # the SFT step is the same code with another loss
    assert result["grpo"]["tokens_per_s"] > 0 and result["grpo"]["params"] > 0 and "sft" not in result
    assert result["grpo"]["mfu"] is None  # a CPU has no known peak
    assert result["tokens_per_step"] == TINY.rows * TINY.seq_len


@pytest.mark.slow
def test_the_sampler_section_writes_the_weights_and_tokens_the_peer_reads(tmp_path):
    result = orchard_sampler(TINY, str(tmp_path))
    assert set(result["batches"]) == {str(b) for b in TINY.batches}
    assert os.path.exists(tmp_path / "model" / "config.json")
    with open(tmp_path / "orchard_tokens.json") as handle:
        tokens = json.load(handle)
    assert [len(tokens[str(b)]) for b in TINY.batches] == list(TINY.batches)
    assert all(len(row) == TINY.new_tokens for b in TINY.batches for row in tokens[str(b)])


@pytest.mark.slow
def test_the_blockwise_attention_matches_jax_s_own_on_the_peer_s_layout():
    row = attention(TINY, "")["lengths"][str(TINY.attention_lengths[0])]
    assert row["max_abs_difference"] < 1e-4, row  # the same attention, grouped heads included
    assert row["orchard_blockwise"]["forward_backward_s"] > 0 and row["jax_dot_product_attention"]["forward_s"] > 0


def test_headline_ratios_and_greedy_parity():
    assert greedy_parity([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]) == {"rows_identical": 0.5,
                                                                             "agreeing_prefix": pytest.approx(4 / 6)}
    assert peak_flops("NVIDIA H200") == 989e12 and peak_flops("cpu") is None
    sections = {"orchard_train": {"sft": {"tokens_per_s": 300.0}}, "torch_train": {"sft": {"tokens_per_s": 200.0}},
                "orchard_sampler": {"batches": {"64": {"tokens_per_s": 50.0}}},
                "torch_sampler": {"batches": {"64": {"tokens_per_s": 25.0}}},
                "attention": {"lengths": {"8192": {"orchard_blockwise": {"forward_backward_s": 1.0},
                                                   "jax_dot_product_attention": {"forward_backward_s": 2.0}}}}}
    assert compare(sections) == {"sft_tokens_per_s_vs_torch": 1.5, "sampler_batch_64_vs_generate": 2.0,
                                 "attention_8192_time_vs_peer": 0.5}


def test_the_runner_records_a_failing_section_and_writes_one_summary(tmp_path):
    has_torch = importlib.util.find_spec("torch") is not None
    out = tmp_path / "out"
    process = subprocess.run([sys.executable, "experiments/gpu_check/accelerator.py", "--size=tiny", f"--out={out}",
                              "--sections=torch_train", "--budget_s=120"], cwd=ROOT, capture_output=True, text=True,
                             timeout=180)
    assert process.returncode == 0, process.stderr
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["sections"]["torch_train"]
    if has_torch:
        assert entry["status"] == "ok" and entry["result"]["sft"]["tokens_per_s"] > 0
    else:  # no torch here: the section's process fails, and the summary says why
        assert entry["status"] == "error" and "No module named 'torch'" in entry["error"]
    assert summary["size"] == "tiny" and summary["shapes"]["seq_len"] == TINY.seq_len
