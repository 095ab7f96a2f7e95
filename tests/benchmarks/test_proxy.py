"""The proxy benchmark at a toy size: both paths timed, the section rendered, the records written."""

from __future__ import annotations

from benchmarks.proxy import render_proxy_bench, run_proxy_bench


def test_both_paths_are_timed_in_both_modes():
    summary = run_proxy_bench(concurrency=(1, 2), calls=2, progress=False, command="test")
    assert set(summary["results"]) == {"1_plain", "1_stream", "2_plain", "2_stream"}
    two = summary["results"]["2_stream"]
    assert two["proxy"]["n"] == 4 and two["direct"]["n"] == 8  # direct: before and after the proxied calls
    assert two["proxy_cpu_ms_per_call"] >= 0 and two["upstream_cpu_ms_per_call"] >= 0  # 10 ms ticks: 0 at this size
    assert summary["calls_recorded"] == {"proxy": 2 * (1 + 2) * (2 + 1)}  # warm-up calls too; no LiteLLM here
    section = render_proxy_bench(summary)
    assert "| 2 | stream |" in section and "CPU per call: proxy / upstream" in section


def test_the_section_has_litellm_columns_when_it_ran():
    stats = {"direct": {"p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0}, "proxy": {"p50_ms": 2.0, "p95_ms": 3.0, "p99_ms": 4.0},
             "litellm": {"p50_ms": 8.0, "p95_ms": 9.0, "p99_ms": 10.0}, "added_ms": {"p50_ms": 1.0, "p99_ms": 1.0},
             "litellm_added_ms": {"p50_ms": 7.0, "p99_ms": 7.0}, "proxy_over_litellm_p50": 0.25,
             "proxy_cpu_ms_per_call": 0.9, "litellm_cpu_ms_per_call": 4.0, "upstream_cpu_ms_per_call": 0.6}
    summary = {"date": "d", "machine": "m", "command": "c", "completion_tokens": 16, "calls_per_session": 1,
               "litellm": "1.84.0", "results": {"16_plain": stats}}
    row = render_proxy_bench(summary).splitlines()[-1]
    assert row == ("| 16 | plain | 1.00 / 2.00 / 3.00 | 2.00 / 3.00 / 4.00 | +1.00 / +1.00 | 8.00 / 9.00 / 10.00 "
                   "| +7.00 / +7.00 | 0.25 | 0.90 / 4.00 / 0.60 |")
