"""The port-forward benchmark at a toy size, against a real orchestrator (needs root)."""

from __future__ import annotations

from benchmarks.env import BenchConfig
from benchmarks.ports import render_ports, run_ports
from tests.conftest import require_root


def test_exec_http_and_websocket_are_timed_and_rendered():
    require_root()
    summary = run_ports(BenchConfig(iterations=4, warmup=2, rounds=2, progress=False), command="test")
    assert {name: stats["n"] for name, stats in summary["latency"].items()} == {"exec": 4, "http": 4, "websocket": 4}
    assert summary["ratio_p50_over_exec"]["http"] > 0 and summary["ratio_p50_over_exec"]["websocket"] > 0
    assert "| WebSocket round trip through the port forward |" in render_ports(summary)
