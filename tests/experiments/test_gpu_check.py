"""The GPU check's CPU-only steps end to end: ``experiments/gpu_check/run.sh --cpu`` in this environment
(no installs), against ``orchard serve`` with a tiny random Qwen3: export, parity of the server's logprobs
with the learner's, a short GRPO loop synced by disk, and generations that follow new weights. vLLM and
the NCCL sync need a GPU and are not run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.data.tokenizer import Tokenizer
from orchard.models.weights import save_pretrained
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir
from tests.rollout.conftest import tiny_qwen3

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_cpu_steps_of_the_gpu_check_pass_against_orchard_serve(tmp_path):
    model = str(tmp_path / "policy")
    save_pretrained(tiny_qwen3(seed=0), model)
    Tokenizer.from_pretrained(qwen3_tokenizer_dir()).save_pretrained(model)
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable,
           "GPU_CHECK_ARGS": f"--model {model} --steps 2 --group 2 --max_tokens 8"}
    done = subprocess.run(["bash", str(ROOT / "experiments/gpu_check/run.sh"), "--cpu", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["server"] == "orchard" and summary["served_dtype"] == "float32"
    for check in ("parity", "grpo_parity", "follow_disk"):
        assert summary[check]["ok"] and summary[check]["max_abs_diff"] <= 1e-2, check
    assert summary["follow_disk"]["mean_abs_diff_to_old"] > summary["follow_disk"]["mean_abs_diff"]
    assert [step["sync"] for step in summary["grpo"]] == ["disk", "disk"]
    assert all(step["rollout_tokens"] == 2 * 4 * 8 and step["learner_mfu"] is None for step in summary["grpo"])
    assert "follow_nccl" not in summary  # GPU only
    assert sorted(name for name in os.listdir(out / "model") if name.startswith("v")) == ["v3"]  # keep=1: two steps, one perturbation
