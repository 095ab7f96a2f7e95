"""Calendar arithmetic on :class:`datetime.date`."""

from __future__ import annotations

import datetime as dt

DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def is_leap_year(year: int) -> bool:
    """Gregorian rule: every fourth year, except centuries not divisible by 400."""
    if year % 400 == 0:
        return True
    if year % 100 == 0:
        return False
    return year % 4 == 0


def days_in_month(year: int, month: int) -> int:
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, got {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return DAYS_IN_MONTH[month - 1]


def add_months(day: dt.date, months: int) -> dt.date:
    """Move by whole months; a day past the end of the target month is clamped to its last day."""
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    return dt.date(year, month, min(day.day, days_in_month(year, month)))


def business_days(start: dt.date, end: dt.date, holidays: tuple[dt.date, ...] = ()) -> int:
    """Weekdays in ``[start, end)`` that are not holidays; negative when ``end`` is before ``start``."""
    if end < start:
        return -business_days(end, start, holidays)
    skip = set(holidays)
    count = 0
    day = start
    while day < end:
        if day.weekday() < 5 and day not in skip:
            count += 1
        day += dt.timedelta(days=1)
    return count


def next_weekday(day: dt.date, weekday: str) -> dt.date:
    """The first date strictly after ``day`` that falls on ``weekday`` (e.g. ``"friday"``)."""
    try:
        target = WEEKDAYS.index(weekday.lower())
    except ValueError:
        raise ValueError(f"unknown weekday {weekday!r}") from None
    ahead = (target - day.weekday()) % 7
    if ahead == 0:
        ahead = 7
    return day + dt.timedelta(days=ahead)


def quarter(day: dt.date) -> int:
    """The calendar quarter, 1 to 4."""
    return (day.month - 1) // 3 + 1
