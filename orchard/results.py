"""Results as Markdown: one table renderer, and the sections of a page that runs rewrite from their JSON.

Every Markdown table the project writes (the benchmarks' sections of ``docs/benchmarks.md``, the recipes'
result tables) comes from :func:`markdown_table`; a benchmark script ends with :func:`publish`, which writes its
JSON summary and rewrites its own section of a shared page (:func:`write_markdown_section`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from orchard.workdir import write_json

Align = Literal["left", "right", "center"]
MISSING = "—"
_RULES: dict[Align | None, str] = {None: "---", "left": ":---", "right": "---:", "center": ":---:"}


def _cell(value: Any, digits: int = 2) -> str:
    """One cell's text: a string as it is, ``None`` as an em dash, a float with ``digits`` decimals and thousands
    separators (``1,234.50``; ``nan`` and ``inf`` as Python writes them), anything else (ints, bools) as ``str``.
    A ``|`` is escaped and a line break becomes a space, so a cell never breaks its row."""
    if value is None:
        text = MISSING
    elif isinstance(value, str):
        text = value
    elif isinstance(value, float) and math.isfinite(value):
        text = f"{value:,.{digits}f}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\r\n", " ").replace("\n", " ")


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]],
                   align: Align | Sequence[Align | None] | None = None, *, digits: int = 2) -> str:
    """A GitHub-flavoured Markdown table, without a trailing newline.

    ``columns`` are the header cells (``""`` for a blank one), each row one value per column: pre-formatted
    strings are kept as they are, other values are formatted (``None`` is an em dash, floats
    get ``digits`` decimals). ``align`` is one alignment for every column or one per column (``None``: the
    renderer's default, left); it only changes the separator row (``---``, ``:---``, ``---:``, ``:---:``).
    A row with another number of cells than ``columns`` is a :class:`ValueError`.

    >>> print(markdown_table(["", "p50 (ms)"], [["exec", 1.5], ["create", None]], [None, "right"]))
    | | p50 (ms) |
    |---|---:|
    | exec | 1.50 |
    | create | — |
    """
    columns = list(columns)
    if not columns:
        raise ValueError("a table needs at least one column")
    if align is None or isinstance(align, str):
        aligns: list[Align | None] = [align] * len(columns)
    else:
        aligns = list(align)
        if len(aligns) != len(columns):
            raise ValueError(f"{len(aligns)} alignments for {len(columns)} columns")
    if unknown := [a for a in aligns if a not in _RULES]:
        raise ValueError(f"unknown alignment {unknown[0]!r}; use 'left', 'right', 'center' or None")
    lines = [_line(_cell(c) for c in columns), "|" + "|".join(_RULES[a] for a in aligns) + "|"]
    for number, row in enumerate(rows):
        cells = [_cell(value, digits) for value in row]
        if len(cells) != len(columns):
            raise ValueError(f"row {number} has {len(cells)} cells for {len(columns)} columns: {cells}")
        lines.append(_line(cells))
    return "\n".join(lines)


def _line(cells: Iterable[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def write_markdown_section(path: str | os.PathLike[str], name: str, body: str) -> None:
    """Replace (or append) the block between ``<!-- name -->`` and ``<!-- /name -->`` in ``path`` with ``body``.

    Several runs share a page (``docs/benchmarks.md``); each rewrites only its own section and leaves the rest of
    the page as it was. A page that does not exist yet starts as ``# Benchmarks``.
    """
    path = Path(path)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def publish(summary: dict[str, Any], out: str | os.PathLike[str], markdown: str | os.PathLike[str] | None,
            section: str, render: Callable[[dict[str, Any]], str]) -> None:
    """What every benchmark script ends with: ``summary`` as indented JSON at ``out`` (parent folders made, the
    file replaced whole), ``render(summary)`` as section ``section`` of the page ``markdown`` (when given), and
    the JSON on stdout."""
    write_json(os.fspath(out), summary)
    if markdown is not None:
        write_markdown_section(markdown, section, render(summary))
    print(json.dumps(summary, indent=2))
