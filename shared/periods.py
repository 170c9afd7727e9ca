"""Period maths: which period an event belongs to, in a board's timezone.

``daily`` ids look like ``2026-11-29``, ``weekly`` like ``2026-W48`` (ISO week, Monday start),
``monthly`` like ``2026-11`` and ``alltime`` is always ``all``. A period starts and ends at local
midnight in the board's timezone, so a day may last 23 or 25 hours across a DST change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

Period = Literal["daily", "weekly", "monthly", "alltime"]
PERIODS: tuple[Period, ...] = ("daily", "weekly", "monthly", "alltime")
ALLTIME_ID = "all"

# The all-time period has no start of its own; reach times count from here.
ALLTIME_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)

_PATTERNS: dict[Period, re.Pattern[str]] = {
    "daily": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
    "weekly": re.compile(r"^\d{4}-W\d{2}$"),
    "monthly": re.compile(r"^\d{4}-\d{2}$"),
    "alltime": re.compile(r"^all$"),
}


class PeriodIdError(ValueError):
    """A period id that does not name a period."""


@dataclass(frozen=True, slots=True)
class PeriodWindow:
    """One period of one board: its id and its bounds in UTC (``end`` exclusive)."""

    period: Period
    period_id: str
    start: datetime
    end: datetime | None


def _local_midnight(day: date, tz: ZoneInfo) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)


def _first_day(period: Period, local_day: date) -> date:
    if period == "daily":
        return local_day
    if period == "weekly":
        return local_day - timedelta(days=local_day.isoweekday() - 1)
    return local_day.replace(day=1)


def _next_first_day(period: Period, first: date) -> date:
    if period == "daily":
        return first + timedelta(days=1)
    if period == "weekly":
        return first + timedelta(days=7)
    return (first.replace(day=28) + timedelta(days=4)).replace(day=1)


def _format(period: Period, first: date) -> str:
    if period == "daily":
        return first.isoformat()
    if period == "weekly":
        year, week, _ = first.isocalendar()
        return f"{year}-W{week:02d}"
    return f"{first.year:04d}-{first.month:02d}"


def window_at(period: Period, moment: datetime, timezone: str) -> PeriodWindow:
    """The period of ``period`` kind that contains ``moment`` in ``timezone``."""
    if moment.tzinfo is None:
        raise ValueError("moment must carry an offset")
    if period == "alltime":
        return PeriodWindow(period, ALLTIME_ID, ALLTIME_EPOCH, None)
    tz = ZoneInfo(timezone)
    first = _first_day(period, moment.astimezone(tz).date())
    nxt = _next_first_day(period, first)
    return PeriodWindow(
        period, _format(period, first), _local_midnight(first, tz), _local_midnight(nxt, tz)
    )


def window_of(period: Period, period_id: str, timezone: str) -> PeriodWindow:
    """The period named by ``period_id``; raises :class:`PeriodIdError` if it names none."""
    if not _PATTERNS[period].fullmatch(period_id):
        raise PeriodIdError(f"{period_id!r} is not a {period} period id")
    if period == "alltime":
        return PeriodWindow(period, ALLTIME_ID, ALLTIME_EPOCH, None)
    try:
        if period == "daily":
            first = date.fromisoformat(period_id)
        elif period == "weekly":
            year, week = period_id.split("-W")
            first = date.fromisocalendar(int(year), int(week), 1)
        else:
            year, month = period_id.split("-")
            first = date(int(year), int(month), 1)
    except ValueError as exc:
        raise PeriodIdError(f"{period_id!r} is not a {period} period id") from exc
    tz = ZoneInfo(timezone)
    try:
        start = _local_midnight(first, tz)
        end = _local_midnight(_next_first_day(period, first), tz)
    except OverflowError as exc:  # begins or ends outside years 1 to 9999 (in UTC)
        raise PeriodIdError(f"{period_id!r} is out of range") from exc
    return PeriodWindow(period, period_id, start, end)


def previous_window(window: PeriodWindow, timezone: str, count: int) -> PeriodWindow:
    """The window ``count`` periods before ``window`` (``count`` >= 0)."""
    current = window
    for _ in range(count):
        current = window_at(current.period, current.start - timedelta(seconds=1), timezone)
    return current


def expire_at(window: PeriodWindow, timezone: str, retention: int | None) -> int | None:
    """Unix time at which a period's keys expire: ``retention`` periods after it ends.

    ``None`` means never (all-time, or no retention set).
    """
    if window.end is None or retention is None:
        return None
    end = window.end
    for _ in range(retention):
        end = window_at(window.period, end, timezone).end or end
    return int(end.timestamp())
