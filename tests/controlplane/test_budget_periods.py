"""A budget's period for an instant, by the calendar of its time zone (no clock, no server)."""
from datetime import datetime, timedelta, timezone

import pytest

from controlplane.budgets.periods import EPOCH, Period, period_of

UTC = timezone.utc


def at(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)


def test_a_utc_day_and_month():
    assert period_of("day", "UTC", at(2026, 12, 5, 23, 59)) == Period(at(2026, 12, 5), at(2026, 12, 6))
    assert period_of("month", "UTC", at(2026, 12, 31, 23, 59)) == Period(at(2026, 12, 1), at(2027, 1, 1))
    assert period_of("month", "UTC", at(2027, 2, 1)) == Period(at(2027, 2, 1), at(2027, 3, 1))


def test_the_local_calendar_decides_not_utc():
    """23:30 UTC on the 31st is already the 1st in Berlin (UTC+1 in winter): a new month
    there, which began at 23:00 UTC."""
    period = period_of("month", "Europe/Berlin", at(2026, 12, 31, 23, 30))
    assert period == Period(at(2026, 12, 31, 23), at(2027, 1, 31, 23))
    assert period_of("day", "America/New_York", at(2026, 12, 6, 3)) == Period(at(2026, 12, 5, 5), at(2026, 12, 6, 5))


def test_a_day_across_dst_is_23_or_25_hours():
    spring = period_of("day", "Europe/Berlin", at(2026, 3, 29, 12))
    assert spring.end - spring.start == timedelta(hours=23)
    autumn = period_of("day", "Europe/Berlin", at(2026, 10, 25, 12))
    assert autumn.end - autumn.start == timedelta(hours=25)
    month = period_of("month", "Europe/Berlin", at(2026, 3, 15))
    assert (month.start, month.end) == (at(2026, 2, 28, 23), at(2026, 3, 31, 22))


def test_a_skipped_midnight_starts_the_day_at_its_first_instant():
    """America/Santiago springs forward at 00:00 (to 01:00) on 2026-09-06: that day's
    first instant is 01:00 local, 04:00 UTC; the day before ends there."""
    day = period_of("day", "America/Santiago", at(2026, 9, 6, 12))
    assert day.start == at(2026, 9, 6, 4)
    assert period_of("day", "America/Santiago", at(2026, 9, 6, 3, 59)).end == day.start


@pytest.mark.parametrize("kind", ["day", "month"])
def test_periods_tile_time_without_gaps(kind):
    """Each instant lies in exactly one period, and the next period starts where it ends."""
    instant = at(2026, 1, 1)
    for _ in range(400):
        period = period_of(kind, "Australia/Lord_Howe", instant)   # half-hour DST shifts
        assert period.start <= instant < period.end
        assert period_of(kind, "Australia/Lord_Howe", period.end).start == period.end
        instant += timedelta(hours=7, minutes=13)


def test_none_is_one_period_for_ever():
    assert period_of("none", "UTC", at(2026, 12, 5)) == Period(EPOCH, None)
    assert period_of("none", "Asia/Tokyo", at(2030, 1, 1)) == Period(EPOCH, None)


def test_unknown_zone_and_period_are_refused_by_name():
    with pytest.raises(ValueError, match="Mars/Olympus"):
        period_of("day", "Mars/Olympus", at(2026, 1, 1))
    with pytest.raises(ValueError, match="week"):
        period_of("week", "UTC", at(2026, 1, 1))
