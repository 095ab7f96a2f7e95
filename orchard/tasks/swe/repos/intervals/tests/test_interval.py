import datetime as dt

import pytest
from intervals import Interval, gaps, merge, total_length


def test_rejects_end_before_start():
    with pytest.raises(ValueError, match="before its start"):
        Interval(5, 2)


def test_length_and_empty():
    assert Interval(2, 7).length == 5
    assert Interval(3, 3).is_empty()
    assert not Interval(3, 4).is_empty()


def test_contains_is_half_open():
    interval = Interval(1, 4)
    assert interval.contains(1)
    assert interval.contains(3.5)
    assert not interval.contains(4)
    assert not interval.contains(0)


def test_overlaps():
    assert Interval(1, 5).overlaps(Interval(4, 8))
    assert Interval(4, 8).overlaps(Interval(1, 5))
    assert not Interval(1, 3).overlaps(Interval(3, 5))
    assert not Interval(2, 2).overlaps(Interval(1, 5))


def test_touches():
    assert Interval(1, 3).touches(Interval(3, 5))
    assert Interval(3, 5).touches(Interval(1, 3))
    assert not Interval(1, 3).touches(Interval(4, 5))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(3, 9).intersection(Interval(1, 5)) == Interval(3, 5)
    assert Interval(1, 2).intersection(Interval(2, 3)) is None


def test_span_and_shift():
    assert Interval(1, 2).span(Interval(5, 7)) == Interval(1, 7)
    assert Interval(1, 2).shift(10) == Interval(11, 12)


def test_split():
    assert Interval(0, 10).split(4) == (Interval(0, 4), Interval(4, 10))
    with pytest.raises(ValueError):
        Interval(0, 10).split(10)
    with pytest.raises(ValueError):
        Interval(0, 10).split(0)


def test_merge_overlapping_and_touching():
    merged = merge([Interval(7, 8), Interval(1, 3), Interval(2, 5), Interval(5, 6)])
    assert merged == [Interval(1, 6), Interval(7, 8)]


def test_merge_keeps_the_longer_end():
    assert merge([Interval(1, 10), Interval(2, 3)]) == [Interval(1, 10)]


def test_merge_drops_empty_intervals():
    assert merge([Interval(4, 4), Interval(1, 2)]) == [Interval(1, 2)]
    assert merge([]) == []


def test_gaps():
    busy = [Interval(9, 10), Interval(12, 13), Interval(12, 14)]
    assert gaps(busy, Interval(8, 17)) == [Interval(8, 9), Interval(10, 12), Interval(14, 17)]


def test_gaps_clips_to_the_window():
    busy = [Interval(0, 9), Interval(16, 20)]
    assert gaps(busy, Interval(8, 17)) == [Interval(9, 16)]
    assert gaps([], Interval(1, 2)) == [Interval(1, 2)]
    assert gaps([Interval(0, 5)], Interval(1, 2)) == []


def test_total_length_counts_overlaps_once():
    assert total_length([Interval(0, 4), Interval(2, 6), Interval(10, 11)]) == 7
    assert total_length([]) == 0


def test_intervals_of_dates():
    week = Interval(dt.date(2024, 3, 4), dt.date(2024, 3, 11))
    assert week.length == dt.timedelta(days=7)
    assert week.contains(dt.date(2024, 3, 10))
    assert not week.contains(dt.date(2024, 3, 11))
