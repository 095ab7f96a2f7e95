"""Greedy word wrapping, justification and indentation."""

from __future__ import annotations


def _chunks(word: str, width: int) -> list[str]:
    """Split a word longer than ``width`` into pieces of at most ``width`` characters."""
    return [word[i : i + width] for i in range(0, len(word), width)]


def wrap(text: str, width: int) -> list[str]:
    """Greedy wrap: as many words per line as fit in ``width``; longer words are broken."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    lines: list[str] = []
    current: list[str] = []
    length = 0
    for word in text.split():
        pieces = _chunks(word, width) if len(word) > width else [word]
        for piece in pieces:
            extra = len(piece) if not current else len(piece) + 1
            if length + extra > width:
                lines.append(" ".join(current))
                current, length = [piece], len(piece)
            else:
                current.append(piece)
                length += extra
    if current:
        lines.append(" ".join(current))
    return lines


def justify(line: str, width: int) -> str:
    """Spread the words of ``line`` to exactly ``width`` characters; extra spaces go to the left gaps."""
    words = line.split()
    if len(words) < 2:
        return line.strip().ljust(width)
    letters = sum(len(word) for word in words)
    gaps = len(words) - 1
    spaces, extra = divmod(width - letters, gaps)
    if spaces < 1:
        raise ValueError(f"{line!r} does not fit in {width} characters")
    out = []
    for index, word in enumerate(words[:-1]):
        out.append(word)
        out.append(" " * (spaces + (1 if index < extra else 0)))
    out.append(words[-1])
    return "".join(out)


def indent(text: str, prefix: str, skip_blank: bool = True) -> str:
    """Put ``prefix`` before every line (blank lines stay blank unless ``skip_blank`` is false)."""
    out = []
    for line in text.splitlines(keepends=True):
        if skip_blank and not line.strip():
            out.append(line)
        else:
            out.append(prefix + line)
    return "".join(out)
