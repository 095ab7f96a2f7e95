"""orchard.results: the one Markdown table renderer, page sections, and publishing a summary."""

from __future__ import annotations

import json

import pytest

from orchard.results import markdown_table, publish, write_markdown_section


def test_a_table_has_a_header_a_separator_and_one_line_per_row():
    table = markdown_table(["", "orchard", "peer"], [["exec p50 (ms)", 1.5, 1234.5678], ["create (ms)", None, 3]],
                           [None, "right", "center"])
    assert table.splitlines() == ["| | orchard | peer |", "|---|---:|:---:|", "| exec p50 (ms) | 1.50 | 1,234.57 |",
                                  "| create (ms) | — | 3 |"]


def test_strings_are_kept_as_given_and_floats_take_the_digits_asked_for():
    table = markdown_table(["a", "b"], [["0.5000", 0.123456], ["", float("nan")]], "left", digits=4)
    assert table.splitlines()[1:] == ["|:---|:---|", "| 0.5000 | 0.1235 |", "| | nan |"]


def test_a_cell_never_breaks_its_row():
    [_, _, row] = markdown_table(["error"], [["a | b\nc"]]).splitlines()
    assert row == "| a \\| b c |"


@pytest.mark.parametrize(("rows", "align"), [([[1, 2, 3]], None), ([[1, 2]], ["right"]), ([[1, 2]], "middle")])
def test_rows_and_alignments_must_fit_the_columns(rows, align):
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], rows, align)


def test_markdown_sections_are_replaced_in_place(tmp_path):
    page = tmp_path / "benchmarks.md"
    write_markdown_section(page, "a", "first A")
    write_markdown_section(page, "b", "first B")
    write_markdown_section(page, "a", "second A")
    text = page.read_text()
    assert text.startswith("# Benchmarks")
    assert "second A" in text and "first A" not in text and "first B" in text
    assert text.index("second A") < text.index("first B")  # A kept its place


def test_publish_writes_the_json_and_the_section_and_prints_the_json(tmp_path, capsys):
    summary = {"p50_ms": {"orchard": 1.25, "peer": 2.5}}
    out, page = tmp_path / "results" / "summary.json", tmp_path / "docs" / "benchmarks.md"

    def render(s):
        return markdown_table(["", *s["p50_ms"]], [["p50 (ms)", *s["p50_ms"].values()]])

    publish(summary, out, page, "bench", render)
    assert json.loads(out.read_text()) == summary and json.loads(capsys.readouterr().out) == summary
    assert "<!-- bench -->\n| | orchard | peer |\n|---|---|---|\n| p50 (ms) | 1.25 | 2.50 |\n<!-- /bench -->" in page.read_text()
    publish(summary, out, None, "bench", render)  # no page: the JSON alone
