"""The confinement benchmark, at a toy size, against two real orchestrators (needs root)."""

from __future__ import annotations

from benchmarks.confinement import render_confinement, run_confinement
from benchmarks.env import BenchConfig
from tests.conftest import require_root


def test_both_variants_are_timed_and_rendered():
    require_root()
    summary = run_confinement(BenchConfig(iterations=4, warmup=1, creates=2, rounds=2, progress=False),
                              command="test", syscall_calls=100)
    for variant in ("confined", "unconfined"):
        assert summary["latency"][variant]["create"]["n"] == 2 and summary["latency"][variant]["exec"]["n"] == 4
    assert summary["ratio_p50"]["create"] > 0
    costs = summary["syscalls"]["ns_per_call"]
    assert set(costs) == {"none", "deny list", "allow list"} and all(len(calls) == 3 for calls in costs.values())
    assert all(cost > 0 for calls in costs.values() for cost in calls.values())
    rendered = render_confinement(summary)
    assert "| create to first exec |" in rendered and "| getppid |" in rendered
