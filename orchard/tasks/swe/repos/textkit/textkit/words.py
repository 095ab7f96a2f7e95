"""Truncation, slugs and plurals."""

from __future__ import annotations

import re
import unicodedata

IRREGULAR = {"child": "children", "person": "people", "mouse": "mice", "goose": "geese"}


def truncate(text: str, width: int, ellipsis: str = "...") -> str:
    """Cut ``text`` to at most ``width`` characters, ending with ``ellipsis`` when cut.

    The cut prefers a word boundary when one lies in the second half of the kept text.
    """
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return ellipsis[:width]
    keep = width - len(ellipsis)
    cut = text[:keep]
    space = cut.rfind(" ")
    if space > keep // 2:
        cut = cut[:space]
    return cut.rstrip() + ellipsis


def slugify(text: str, separator: str = "-") -> str:
    """Lowercase ASCII words joined by ``separator``; accents are stripped, punctuation dropped."""
    normalized = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", normalized.lower())
    return separator.join(words)


def plural(count: int, word: str) -> str:
    """``"1 apple"``, ``"2 apples"``, ``"3 boxes"``, ``"2 children"``."""
    if count == 1:
        return f"{count} {word}"
    if word in IRREGULAR:
        form = IRREGULAR[word]
    elif word.endswith(("s", "x", "z", "ch", "sh")):
        form = word + "es"
    elif word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        form = word[:-1] + "ies"
    else:
        form = word + "s"
    return f"{count} {form}"
