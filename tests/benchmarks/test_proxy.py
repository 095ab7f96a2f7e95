"""The proxy benchmark at a toy size: both paths timed, the section rendered, the records written."""

from __future__ import annotations

from benchmarks.proxy import render_proxy_bench, run_proxy_bench


def test_both_paths_are_timed_in_both_modes():
    summary = run_proxy_bench(concurrency=(1, 2), calls=2, progress=False, command="test")
    assert set(summary["results"]) == {"1_plain", "1_stream", "2_plain", "2_stream"}
    two = summary["results"]["2_stream"]
    assert two["proxy"]["n"] == 4 and two["direct"]["n"] == 8  # direct: before and after the proxied calls
    assert two["proxy_cpu_ms_per_call"] >= 0 and two["upstream_cpu_ms_per_call"] >= 0  # 10 ms ticks: 0 at this size
    section = render_proxy_bench(summary)
    assert "| 2 | stream |" in section and "CPU per call: proxy / upstream" in section
