"""Small text utilities."""

from textkit.table import format_table
from textkit.words import plural, slugify, truncate
from textkit.wrap import indent, justify, wrap

__all__ = ["format_table", "indent", "justify", "plural", "slugify", "truncate", "wrap"]
