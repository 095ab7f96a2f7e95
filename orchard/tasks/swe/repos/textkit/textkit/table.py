"""Plain-text tables with aligned columns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _cell(value: Any, precision: int) -> str:
    if isinstance(value, float):
        return f"{value:.{precision}f}"
    return "" if value is None else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_table(rows: Sequence[Sequence[Any]], headers: Sequence[str] | None = None, precision: int = 2,
                 separator: str = "  ") -> str:
    """Render rows as text: numbers right-aligned, everything else left-aligned.

    Rows may be shorter than the header; missing cells are blank. A rule of dashes separates the
    header from the body.
    """
    columns = max([len(headers) if headers else 0, *(len(row) for row in rows)], default=0)
    if columns == 0:
        return ""
    cells = [[_cell(row[i], precision) if i < len(row) else "" for i in range(columns)] for row in rows]
    numeric = [all(_is_number(row[i]) for row in rows if i < len(row)) and any(i < len(row) for row in rows)
               for i in range(columns)]
    header_cells = [str(h) for h in headers] + [""] * (columns - len(headers)) if headers else None
    widths = [max([len(row[i]) for row in cells] + ([len(header_cells[i])] if header_cells else []))
              for i in range(columns)]

    def render(line: list[str]) -> str:
        parts = [text.rjust(widths[i]) if numeric[i] else text.ljust(widths[i]) for i, text in enumerate(line)]
        return separator.join(parts).rstrip()

    out = []
    if header_cells:
        out.append(render(header_cells))
        out.append(separator.join("-" * width for width in widths))
    out.extend(render(row) for row in cells)
    return "\n".join(out)
