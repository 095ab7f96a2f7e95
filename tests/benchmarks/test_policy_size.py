"""The policy-size sweep: each shape's parameter count and a rate against the tiny default's."""

from __future__ import annotations

from benchmarks.policy_size import SHAPES, SftBenchConfig, render_markdown, run_sweep


def test_the_sweep_reports_each_shape_against_the_tiny_default():
    base = SftBenchConfig(vocab_size=300, seq_len=32, batch_size=2, warmup=1, steps=1, repeats=1, examples=50)
    summary = run_sweep(base, shapes=SHAPES[:2], command="python experiments/policy_size/run.py")
    tiny, wider = summary["rows"]
    assert (tiny["shape"], wider["shape"]) == ("tiny", "w128-l4") and tiny["vs_tiny"] == 1.0
    assert tiny["parameters"] < wider["parameters"]
    # 2 layers of width 64 (q and o 64 x 64, k and v 64 x 32 for 2 KV heads of 16, an MLP of 3 x 64 x 192, two
    # norms and the QK norms), untied embeddings of 300 and the final norm
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 192 + 2 * 64 + 2 * 16
    assert tiny["parameters"] == 2 * layer + 2 * 300 * 64 + 64
    assert wider["tokens_per_s"] > 0 and wider["vs_tiny"] == wider["tokens_per_s"] / tiny["tokens_per_s"]
    assert "| w128-l4 |" in render_markdown(summary)
