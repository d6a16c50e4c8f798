"""A budget's period for an instant, by the calendar of the budget's time zone: pure.

`day` runs from one local midnight to the next and `month` from the first of one month
to the first of the next, whatever the UTC offset does in between (a day of 23 or 25
hours across a DST change). `none` is one period for ever, from the epoch on. A local
midnight that does not exist (a zone that springs forward at 00:00) resolves to the
first instant of that local day; one that happens twice, to the first of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from typing import Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

PERIODS = ("day", "month", "none")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Period:
    start: datetime                 # UTC
    end: Optional[datetime]         # UTC, exclusive; None: never ends


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; ValueError when there is none of that name."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as Europe/Berlin)") from None


def period_of(kind: str, time_zone: str, at: datetime) -> Period:
    """The period of kind `kind` in `time_zone` that holds the instant `at`."""
    if kind == "none":
        return Period(EPOCH, None)
    tz = zone(time_zone)
    local = at.astimezone(tz).date()
    if kind == "day":
        first, after = local, local + timedelta(days=1)
    elif kind == "month":
        first = local.replace(day=1)
        after = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    else:
        raise ValueError(f"unknown period {kind!r}: one of {', '.join(PERIODS)}")
    return Period(_midnight(first, tz), _midnight(after, tz))


def _midnight(day: date, tz: ZoneInfo) -> datetime:
    """The first instant of the local `day`: fold 0 takes the offset before a change,
    which puts a skipped midnight at the first instant that exists and a repeated one at
    its first occurrence."""
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(timezone.utc)
