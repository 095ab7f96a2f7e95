"""Pieces of the benchmark harness that need no servers."""

from __future__ import annotations

from benchmarks.env import percentile


def test_percentile_interpolates():
    samples = [1.0, 2.0, 3.0, 4.0]
    assert percentile(samples, 50) == 2.5
    assert percentile(samples, 0) == 1.0 and percentile(samples, 100) == 4.0
