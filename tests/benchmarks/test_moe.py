"""The MoE benchmark at a toy size: both sides compiled and run, FLOPs read, the JSON and section shaped right."""

from __future__ import annotations

from benchmarks.moe import MoeBenchConfig, render_markdown, run_benchmark

TINY = MoeBenchConfig(hidden_size=16, ffn=32, experts=(4,), top_k=(1, 8), tokens=32, repeats=1)


def test_a_tiny_run_reports_every_configuration():
    summary = run_benchmark(TINY, command="test")
    rows = summary["results"]
    assert [(r["experts"], r["top_k"]) for r in rows] == [(4, 1)]  # k=8 > 4 experts is skipped
    assert [(p["experts"], p["top_k"]) for p in summary["every_expert"]] == [(4, 1)]
    for row in rows:
        assert row["tokens"] == 32 and 0 <= row["experts_without_tokens"] < row["experts"]
        for side in ("sparse", "every_expert"):
            assert set(row[side]) == {"fwd_flops", "fwd_us_per_token", "fwd_bwd_flops", "fwd_bwd_us_per_token"}
            assert all(value > 0 for value in row[side].values())
        assert row["speedup_fwd"] > 0 and row["speedup_fwd_bwd"] > 0
    one_of_four = rows[0]  # FLOPs are XLA's count, not a timing: the routed rows, not every expert's
    assert one_of_four["routed_fwd_flops"] <= one_of_four["sparse"]["fwd_flops"] < one_of_four["every_expert"]["fwd_flops"]
    assert summary["metadata"]["config"]["tokens"] == 32 and summary["metadata"]["command"] == "test"
    markdown = render_markdown(summary)
    assert markdown.startswith("## Sparse MoE dispatch") and "| 4 | 1 |" in markdown and "Reproduce: `test`" in markdown
