"""The Claw benchmark at a toy size, against a real orchestrator (needs root)."""

from __future__ import annotations

import pytest

from benchmarks.claw import render_claw_bench, run_claw_bench
from benchmarks.env import BenchConfig
from tests.conftest import require_root


@pytest.mark.slow
def test_set_up_tool_calls_and_rollouts_are_measured_and_rendered():
    require_root()
    summary = run_claw_bench(BenchConfig(iterations=3, warmup=1, progress=False), starts=1, concurrency=(2,),
                             seconds=2.0, command="test")
    assert set(summary["tool_call"]) == {"env_port_forward", "host_loopback", "in_process"}
    assert summary["setup_fresh"]["p50_ms"] > summary["setup_pooled_reset"]["p50_ms"] > 0
    [rollouts] = summary["rollouts"]
    assert rollouts["episodes"] >= 1 and rollouts["solved"] == rollouts["episodes"]  # the reference plans pass
    assert "| through Orchard Env's port forward |" in render_claw_bench(summary)
