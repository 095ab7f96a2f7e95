import datetime as dt

import pytest
from intervals import add_months, business_days, days_in_month, is_leap_year, next_weekday, quarter


@pytest.mark.parametrize(("year", "leap"), [(2024, True), (2023, False), (1900, False), (2000, True)])
def test_is_leap_year(year, leap):
    assert is_leap_year(year) is leap


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31


def test_days_in_month_rejects_bad_months():
    with pytest.raises(ValueError, match="month"):
        days_in_month(2023, 13)
    with pytest.raises(ValueError, match="month"):
        days_in_month(2023, 0)


def test_add_months_simple():
    assert add_months(dt.date(2023, 1, 15), 1) == dt.date(2023, 2, 15)
    assert add_months(dt.date(2023, 11, 15), 3) == dt.date(2024, 2, 15)


def test_add_months_clamps_to_month_end():
    assert add_months(dt.date(2023, 1, 31), 1) == dt.date(2023, 2, 28)
    assert add_months(dt.date(2024, 1, 31), 1) == dt.date(2024, 2, 29)


def test_add_months_backwards():
    assert add_months(dt.date(2023, 3, 31), -1) == dt.date(2023, 2, 28)
    assert add_months(dt.date(2023, 1, 10), -13) == dt.date(2021, 12, 10)


def test_business_days_in_a_week():
    monday = dt.date(2024, 3, 4)
    assert business_days(monday, monday + dt.timedelta(days=7)) == 5
    assert business_days(monday, monday) == 0


def test_business_days_skip_holidays_and_weekends():
    friday = dt.date(2024, 3, 8)
    tuesday = dt.date(2024, 3, 12)
    assert business_days(friday, tuesday) == 2
    assert business_days(friday, tuesday, holidays=(dt.date(2024, 3, 11),)) == 1


def test_business_days_reversed_is_negative():
    assert business_days(dt.date(2024, 3, 11), dt.date(2024, 3, 4)) == -5


def test_next_weekday():
    wednesday = dt.date(2024, 3, 6)
    assert next_weekday(wednesday, "friday") == dt.date(2024, 3, 8)
    assert next_weekday(wednesday, "Monday") == dt.date(2024, 3, 11)
    assert next_weekday(wednesday, "wednesday") == dt.date(2024, 3, 13)


def test_next_weekday_unknown_name():
    with pytest.raises(ValueError, match="unknown weekday"):
        next_weekday(dt.date(2024, 3, 6), "funday")


def test_quarter():
    assert [quarter(dt.date(2024, m, 1)) for m in (1, 3, 4, 6, 7, 9, 10, 12)] == [1, 1, 2, 2, 3, 3, 4, 4]
