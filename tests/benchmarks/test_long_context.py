"""The long-context benchmark at a toy size: both sides compiled and run (or reported as not run), the JSON and
section shaped right."""

from __future__ import annotations

from benchmarks.long_context import LongContextBenchConfig, render_markdown, run_benchmark

TINY = LongContextBenchConfig(tokens=(100,), vocab=128, attention_block=32, logits_chunk=64, isolate=False,
                              memory_budget_gib=64.0)


def test_a_tiny_run_reports_both_sides_at_every_length():
    summary = run_benchmark(TINY, command="test")
    assert [row["tokens"] for row in summary["results"]] == [100]  # 4 blocks of 32, the last padded
    for row in summary["results"]:
        for side in ("blockwise", "dense"):
            result = row[side]
            assert result["side"] == side and result["tokens"] == row["tokens"] and result["ran"]
            assert result["temp_gib"] >= 0 and result["peak_gib"] > 0 and result["step_s"] > 0
            assert result["rss_gib"] > 0 and result["loss"] > 0
        assert row["speedup"] > 0 and row["loss_diff"] < 1e-4  # the same loss, whatever the timings
    assert list(summary["metadata"]["config"]["tokens"]) == [100] and summary["metadata"]["command"] == "test"
    markdown = render_markdown(summary)
    assert markdown.startswith("## Long-context training step") and "| 100 |" in markdown
    assert "Reproduce: `test`" in markdown


def test_a_step_over_the_memory_budget_is_reported_not_run():
    summary = run_benchmark(LongContextBenchConfig(tokens=(64,), vocab=64, attention_block=32, logits_chunk=32,
                                                   isolate=False, memory_budget_gib=1e-9), command="test")
    row = summary["results"][0]
    assert not row["blockwise"]["ran"] and row["blockwise"]["step_s"] is None and row["speedup"] is None
    assert "not run (needs" in render_markdown(summary)
