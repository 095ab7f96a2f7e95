"""The one error type: it carries the position in the source where the problem is."""

from __future__ import annotations


class CalcError(Exception):
    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message if position is None else f"{message} at position {position}")
        self.message = message
        self.position = position
