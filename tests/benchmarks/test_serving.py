"""The serving benchmark at a toy size, on a tiny model: both servers timed, ratios taken, the section rendered."""

from __future__ import annotations

import pytest

from benchmarks.serving import render_serving_bench, run_serving_bench
from orchard.data.tokenizer import Tokenizer
from orchard.models.weights import save_pretrained
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir
from tests.rollout.conftest import tiny_qwen3


@pytest.mark.slow
def test_both_servers_are_timed_at_each_concurrency(tmp_path):
    model = str(tmp_path / "model")
    save_pretrained(tiny_qwen3(seed=0), model)
    Tokenizer.from_pretrained(qwen3_tokenizer_dir()).save_pretrained(model)
    summary = run_serving_bench(concurrency=(1, 3), requests=1, max_tokens=3, prompt_tokens=5, progress=False,
                                command="test", model=model)
    three = summary["results"]["3"]
    for server in ("one_at_a_time", "continuous_batching"):
        assert three[server]["requests"] == 3 and three[server]["completion_tokens"] == 9  # greedy, no EOS cut
    assert three["throughput_ratio"] > 0
    assert "| 3 |" in render_serving_bench(summary)
