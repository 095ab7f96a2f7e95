"""The scale checks of ``experiments/env_bench/run.py``: a small stress run, fork and pool latency,
and the one-minute soak, which must leak nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from benchmarks.env_scale import fork_and_claim, stress
from tests.conftest import require_root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stress_fork_and_claim_report_every_sandbox(orchestrator):
    result = asyncio.run(stress(orchestrator, 8, progress=False))
    assert result["success_rate"] == 1.0 and result["error_count"] == 0
    assert result["uss_per_sandbox_mib"] > 1  # an agent is a real process with real memory
    latency = asyncio.run(fork_and_claim(orchestrator, rounds=2, pool_size=2))
    assert set(latency) == {"fork_1_ms", "fork_8_ms", "pool_claim_ms", "cold_create_ms"}


def test_a_short_soak_leaks_nothing(tmp_path):
    """Six seconds of churn: 137 cycles on a 2-core machine. A leaked process, mount, state file or cgroup
    shows after any cycle; 60 KiB of the orchestrator's memory leaked a cycle would pass the 8 MiB bound.
    The benchmark soaks for minutes."""
    require_root()
    out = tmp_path / "results" / "summary.json"
    done = subprocess.run([sys.executable, "experiments/env_bench/run.py", "--soak", "0.1", "--noprogress",
                           f"--out={out}", f"--markdown={tmp_path / 'bench.md'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    soak = json.loads((tmp_path / "results" / "soak.json").read_text())["soak"]
    assert soak["cycles"] > 10 and soak["failures"] == 0
    leaked = soak["leaked"]
    assert leaked["processes"] == 0 and leaked["mounts"] == 0 and leaked["state_files"] == 0, leaked
    assert leaked["sandbox_cgroups"] == 0
    assert leaked["orchestrator_rss_kib"] < 8 * 1024, leaked  # allocator noise, not a per-sandbox leak
    assert "Orchard Env soak" in (tmp_path / "bench.md").read_text()
