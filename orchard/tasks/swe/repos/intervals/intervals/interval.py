"""Half-open intervals ``[start, end)``.

An interval contains its start but not its end, so ``Interval(1, 3)`` and ``Interval(3, 5)`` touch
without overlapping, and an interval whose start equals its end is empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Interval:
    start: Any
    end: Any

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end!r} is before its start {self.start!r}")

    def __repr__(self) -> str:
        return f"Interval({self.start!r}, {self.end!r})"

    @property
    def length(self) -> Any:
        return self.end - self.start

    def is_empty(self) -> bool:
        return self.start == self.end

    def contains(self, point: Any) -> bool:
        return self.start <= point < self.end

    def overlaps(self, other: Interval) -> bool:
        """True when the two intervals share at least one point."""
        if self.is_empty() or other.is_empty():
            return False
        return self.start < other.end and other.start < self.end

    def touches(self, other: Interval) -> bool:
        """True when one interval ends exactly where the other starts."""
        return self.end == other.start or other.end == self.start

    def intersection(self, other: Interval) -> Interval | None:
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def span(self, other: Interval) -> Interval:
        """The smallest interval that covers both."""
        return Interval(min(self.start, other.start), max(self.end, other.end))

    def shift(self, offset: Any) -> Interval:
        return Interval(self.start + offset, self.end + offset)

    def split(self, point: Any) -> tuple[Interval, Interval]:
        """Cut at ``point``, which must lie strictly inside the interval."""
        if not self.start < point < self.end:
            raise ValueError(f"{point!r} is not strictly inside {self!r}")
        return Interval(self.start, point), Interval(point, self.end)


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sort and merge overlapping or touching intervals; empty intervals are dropped."""
    ordered = sorted(i for i in intervals if not i.is_empty())
    merged: list[Interval] = []
    for interval in ordered:
        if merged and interval.start <= merged[-1].end:
            last = merged.pop()
            merged.append(Interval(last.start, max(last.end, interval.end)))
        else:
            merged.append(interval)
    return merged


def gaps(intervals: list[Interval], within: Interval) -> list[Interval]:
    """The parts of ``within`` that none of ``intervals`` covers, in order."""
    free: list[Interval] = []
    cursor = within.start
    for interval in merge(intervals):
        if interval.end <= within.start:
            continue
        if interval.start >= within.end:
            break
        if interval.start > cursor:
            free.append(Interval(cursor, interval.start))
        cursor = max(cursor, interval.end)
    if cursor < within.end:
        free.append(Interval(cursor, within.end))
    return free


def total_length(intervals: list[Interval]) -> Any:
    """The length covered by the union of ``intervals`` (overlaps counted once)."""
    merged = merge(intervals)
    if not merged:
        return 0
    total = merged[0].length
    for interval in merged[1:]:
        total = total + interval.length
    return total
