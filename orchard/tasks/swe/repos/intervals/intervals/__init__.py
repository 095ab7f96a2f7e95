"""Half-open intervals and calendar arithmetic."""

from intervals.dates import add_months, business_days, days_in_month, is_leap_year, next_weekday, quarter
from intervals.interval import Interval, gaps, merge, total_length

__all__ = [
    "Interval",
    "add_months",
    "business_days",
    "days_in_month",
    "gaps",
    "is_leap_year",
    "merge",
    "next_weekday",
    "quarter",
    "total_length",
]
