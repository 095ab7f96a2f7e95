"""Pieces of the benchmark harness that need no servers."""

from __future__ import annotations

from benchmarks.env import percentile, write_markdown_section


def test_markdown_sections_are_replaced_in_place(tmp_path):
    page = tmp_path / "benchmarks.md"
    write_markdown_section(page, "a", "first A")
    write_markdown_section(page, "b", "first B")
    write_markdown_section(page, "a", "second A")
    text = page.read_text()
    assert text.startswith("# Benchmarks")
    assert "second A" in text and "first A" not in text and "first B" in text
    assert text.index("second A") < text.index("first B")  # A kept its place


def test_percentile_interpolates():
    samples = [1.0, 2.0, 3.0, 4.0]
    assert percentile(samples, 50) == 2.5
    assert percentile(samples, 0) == 1.0 and percentile(samples, 100) == 4.0
