"""Period maths: which period an event belongs to, in a board's timezone.

``daily`` ids look like ``2026-11-29``, ``weekly`` like ``2026-W48`` (ISO week, Monday start),
``monthly`` like ``2026-11`` and ``alltime`` is always ``all``. A period starts and ends at local
midnight in the board's timezone, so a day may last 23 or 25 hours across a DST change.

``season`` exists on boards with a ``schedule`` (a 5-field cron expression, read in the board's
timezone by croniter): a season runs from one firing of the schedule to the next, and its id is
its start in the board's timezone, ``2026-12-04T18:00``. Every function here that may meet a
season takes the board's ``schedule`` (without one a season is no period: PeriodIdError).
Where clocks go back, a schedule fires twice at the wall-clock times of the hour that repeats
(01:30 on summer time, then an hour later): the second pass's firings start no season, so no
two seasons share an id, and the season running when the clocks went back lasts an hour more.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from croniter import CroniterError, croniter

Period = Literal["daily", "weekly", "monthly", "alltime", "season"]
PERIODS: tuple[Period, ...] = ("daily", "weekly", "monthly", "alltime", "season")
# The periods every board may keep; ``season`` also needs a schedule.
CALENDAR_PERIODS: tuple[Period, ...] = ("daily", "weekly", "monthly", "alltime")
ALLTIME_ID = "all"

# The all-time period has no start of its own; reach times count from here.
ALLTIME_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)

_PATTERNS: dict[Period, re.Pattern[str]] = {
    "daily": re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"),
    "weekly": re.compile(r"^[0-9]{4}-W[0-9]{2}$"),
    "monthly": re.compile(r"^[0-9]{4}-[0-9]{2}$"),
    "alltime": re.compile(r"^all$"),
    "season": re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}$"),
}
SEASON_ID_FORMAT = "%Y-%m-%dT%H:%M"


class PeriodIdError(ValueError):
    """A period id that does not name a period."""


class PeriodOutOfCalendar(PeriodIdError):
    """An id of a period that begins or ends outside the calendar (years 1 to 9999, in UTC):
    ``9999-12-31``, ``0001-01-01`` east of UTC. Reads answer it as a period not kept (404)."""


class PeriodRangeError(PeriodIdError):
    """A walk over periods that leaves the calendar (years 1 to 9999): a retention of yearly
    seasons in the thousands, say."""


# What date arithmetic and croniter raise past year 9999 or before year 1.
_OUT_OF_CALENDAR = (ValueError, OverflowError, CroniterError)


@dataclass(frozen=True, slots=True)
class PeriodWindow:
    """One period of one board: its id and its bounds in UTC (``end`` exclusive)."""

    period: Period
    period_id: str
    start: datetime
    end: datetime | None


def close_name(window: PeriodWindow) -> str:
    """What names a period's close, in its claim and its ``period.closed`` message id: the
    period id, and for a season its end as well, in Unix seconds
    (``2026-12-04T18:00/1797012000``). A season id is a start only: a changed schedule (or
    timezone) may start a season at the same minute as one of the schedule before, of another
    length, which is another period."""
    if window.period != "season" or window.end is None:
        return window.period_id
    return f"{window.period_id}/{int(window.end.timestamp())}"


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


def matches_id(period: Period, period_id: str) -> bool:
    """Whether ``period_id`` has the form of a ``period`` id (not whether it names one)."""
    return _PATTERNS[period].fullmatch(period_id) is not None


def schedule_error(schedule: str, *, stored: bool = False) -> str | None:
    """Why ``schedule`` is not a schedule a board may keep (None: it is one): five fields that
    croniter reads, and a firing to come (a ``stored`` one may use R: docs/api.md section 3)."""
    fields = schedule.split()
    if len(fields) != 5:
        return "schedule must be a cron expression of 5 fields (minute hour day month weekday)"
    # croniter's R (random) and H (hashed) pick a time anew at every reading: a season would
    # have other bounds in every process (no month or weekday name starts with either letter).
    refused = ("H",) if stored else ("R", "H")  # H, with no hash id, was never a schedule
    if any(t.upper().startswith(refused) for f in fields for t in f.split(",")):
        return f"schedule {schedule!r} uses R or H: a season's firings must be fixed"
    try:
        if not croniter.is_valid(schedule):
            return f"schedule {schedule!r} is not a cron expression"
        croniter(schedule, datetime.now(UTC)).get_next(datetime)
    except Exception:  # croniter's own errors: a date that never comes (31 February), etc.
        return f"schedule {schedule!r} never fires"
    return None


def _repeated(firing: datetime, tz: ZoneInfo) -> bool:
    """Whether ``firing`` falls in the second pass of a wall-clock hour that the clocks going
    back repeat: a firing that starts no season (the module's docstring)."""
    return firing.astimezone(UTC).astimezone(tz).fold == 1


def _next_start(firings: croniter, tz: ZoneInfo) -> datetime:
    found: datetime = firings.get_next(datetime)
    while _repeated(found, tz):
        found = firings.get_next(datetime)
    return found


def _previous_start(firings: croniter, tz: ZoneInfo) -> datetime:
    found: datetime = firings.get_prev(datetime)
    while _repeated(found, tz):
        found = firings.get_prev(datetime)
    return found


def _season_bounds(schedule: str, moment: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The firings of ``schedule`` that start a season around ``moment``: the last at or before
    it, the next after."""
    local = moment.astimezone(tz).replace(second=0, microsecond=0)
    start = _previous_start(croniter(schedule, _next_start(croniter(schedule, local), tz)), tz)
    # Checked walking forward: croniter's backward walk may step over a firing next to a change
    # of offset (half an hour's, on Lord Howe Island), its forward walk does not.
    firings = croniter(schedule, start)
    end = _next_start(firings, tz)
    while end <= moment:
        start, end = end, _next_start(firings, tz)
    return start.astimezone(UTC), end.astimezone(UTC)


def _season_id(local: datetime) -> str:
    """A season's id, from its start in local time: the year in four digits, which ``%Y`` does
    not give before the year 1000."""
    return f"{local.year:04d}{local.strftime(SEASON_ID_FORMAT[2:])}"


def _season(schedule: str | None) -> str:
    if schedule is None:
        raise PeriodIdError("season is a period of boards with a schedule only")
    return schedule


def window_at(
    period: Period, moment: datetime, timezone: str, schedule: str | None = None
) -> PeriodWindow:
    """The period of ``period`` kind that contains ``moment`` in ``timezone``."""
    if moment.tzinfo is None:
        raise ValueError("moment must carry an offset")
    if period == "season":
        tz = ZoneInfo(timezone)
        start, end = _season_bounds(_season(schedule), moment, tz)
        return PeriodWindow(period, _season_id(start.astimezone(tz)), start, end)
    if period == "alltime":
        return PeriodWindow(period, ALLTIME_ID, ALLTIME_EPOCH, None)
    tz = ZoneInfo(timezone)
    first = _first_day(period, moment.astimezone(tz).date())
    nxt = _next_first_day(period, first)
    return PeriodWindow(
        period, _format(period, first), _local_midnight(first, tz), _local_midnight(nxt, tz)
    )


def window_of(
    period: Period, period_id: str, timezone: str, schedule: str | None = None
) -> PeriodWindow:
    """The period named by ``period_id``; raises :class:`PeriodIdError` if it names none."""
    if not _PATTERNS[period].fullmatch(period_id):
        named = "the alltime period's id, all" if period == "alltime" else f"a {period} period id"
        raise PeriodIdError(f"{period_id!r} is not {named}")
    if period == "season":
        return _season_of(period_id, timezone, _season(schedule))
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
    except OverflowError as exc:
        raise PeriodOutOfCalendar(f"{period_id!r} begins or ends outside years 1 to 9999") from exc
    return PeriodWindow(period, period_id, start, end)


def _season_of(period_id: str, timezone: str, schedule: str) -> PeriodWindow:
    """The season that starts at ``period_id`` (local time), if the schedule fires then."""
    tz = ZoneInfo(timezone)
    try:
        local = datetime.strptime(period_id, SEASON_ID_FORMAT).replace(tzinfo=tz)
    except ValueError as exc:
        raise PeriodIdError(f"{period_id!r} is not a season id") from exc
    try:
        window = window_at("season", local.astimezone(UTC), timezone, schedule)
    except Exception as exc:  # the calendar's ends, or croniter's: no firing within its search
        if _starts_a_season(local, timezone, schedule):
            raise PeriodOutOfCalendar(
                f"{period_id!r} begins or ends outside years 1 to 9999"
            ) from exc
        raise PeriodIdError(f"{period_id!r} is not a start of the board's schedule") from exc
    if window.period_id != period_id:
        raise PeriodIdError(f"{period_id!r} is not a start of the board's schedule")
    return window


def _starts_a_season(local: datetime, timezone: str, schedule: str) -> bool:
    """Whether ``local``, a time near an end of the calendar, starts a season: judged 400 years
    nearer its middle, where croniter can walk around it. The Gregorian calendar repeats every
    400 years (20,871 weeks), and so do the schedule's firings and the timezone's offsets there
    (its rule for the far future, its local mean time far back)."""
    moved = local.replace(year=local.year + (-400 if local.year > 5000 else 400))
    try:
        window = window_at("season", moved.astimezone(UTC), timezone, schedule)
    except Exception:  # croniter's: no firing within its search
        return False
    return window.start == moved.astimezone(UTC)


def windows_before(
    window: PeriodWindow, timezone: str, count: int, schedule: str | None = None
) -> Iterator[PeriodWindow]:
    """The ``count`` windows before ``window``, the nearest first; fewer where the calendar
    ends first (year 1). Seasons come from one walk of the schedule backwards: a retention of
    10,000 minute seasons is walked in a fraction of a second."""
    if window.period == "season":
        tz = ZoneInfo(timezone)
        try:
            firings = croniter(_season(schedule), window.start.astimezone(tz))
        except _OUT_OF_CALENDAR:
            return
        end = window.start
        for _ in range(count):
            try:
                local = _previous_start(firings, tz)
                if local.astimezone(tz).utcoffset() == end.astimezone(tz).utcoffset():
                    season = PeriodWindow("season", _season_id(local), local.astimezone(UTC), end)
                else:  # across a change of offset, the season as the forward walk finds it
                    season = window_at("season", end - timedelta(seconds=1), timezone, schedule)
                    firings = croniter(_season(schedule), season.start.astimezone(tz))
            except _OUT_OF_CALENDAR:
                return
            yield season
            end = season.start
        return
    current = window
    for _ in range(count):
        try:
            current = window_at(
                current.period, current.start - timedelta(seconds=1), timezone, schedule
            )
        except _OUT_OF_CALENDAR:
            return
        yield current


def previous_window(
    window: PeriodWindow, timezone: str, count: int, schedule: str | None = None
) -> PeriodWindow:
    """The window ``count`` periods before ``window`` (``count`` >= 0); raises
    :class:`PeriodRangeError` where that is before the calendar's start."""
    found = list(windows_before(window, timezone, count, schedule))
    if len(found) < count:
        raise PeriodRangeError(f"{count} periods before {window.period_id} is before year 1")
    return found[-1] if found else window


def expire_at(
    window: PeriodWindow, timezone: str, retention: int | None, schedule: str | None = None
) -> int | None:
    """Unix time at which a period's keys expire: ``retention`` periods after it ends.

    ``None`` means never (all-time, no retention set, or a retention that reaches past the
    calendar's end, year 9999).
    """
    if window.end is None or retention is None:
        return None
    end = window.end
    try:
        if window.period == "season":
            # One walk of the schedule from the season's end, not a window_at() (two croniters)
            # a season: a board of minute seasons keeps up to 10,000, worked out at every new
            # season in every process.
            tz = ZoneInfo(timezone)
            firings = croniter(_season(schedule), end.astimezone(tz))
            for _ in range(retention):
                end = _next_start(firings, tz)
        else:
            for _ in range(retention):
                end = window_at(window.period, end, timezone, schedule).end or end
    except _OUT_OF_CALENDAR:
        return None
    return int(end.timestamp())


def retention_error(
    period: Period,
    timezone: str,
    retention: int,
    schedule: str | None,
    now: datetime,
    outlast: float,
) -> str | None:
    """Why a board may not keep ``retention`` periods of ``period`` after each one ends (``None``:
    it may): the walk leaves the calendar (years 1 to 9999), or keeps a period less than
    ``outlast`` seconds after its end (a period must outlive its close). Judged on the period
    that runs at ``now``, and for seasons, whose lengths a schedule may vary (``0,1 * * * *``:
    one minute, then 59), on the shortest keep of the ``SEASONS_JUDGED`` after it too."""
    current = window_at(period, now, timezone, schedule)
    if current.end is None:
        return None
    expiry = expire_at(current, timezone, retention, schedule)
    if expiry is None:
        return f"{retention} {period} periods after the current one end after the year 9999"
    try:
        previous_window(current, timezone, retention, schedule)
    except PeriodRangeError:
        return f"{retention} {period} periods before the current one begin before the year 1"
    kept = expiry - current.end.timestamp()
    if period == "season":
        kept = min(kept, _shortest_season_keep(current.end, timezone, retention, schedule))
    if kept < outlast:
        return (
            f"{retention} {period} periods keep a period {kept:.0f} s after its end; it must be "
            f"kept at least {outlast:.0f} s, until its close (the allowed lateness and a merge "
            "interval after its end) and a minute more"
        )
    return None


# Seasons whose keep retention_error() judges after the current one's. A schedule's seasons
# repeat their lengths in a cycle, mostly of a few (one a day, an hour); a walk of this many is
# about 30 ms.
SEASONS_JUDGED = 1000


def _shortest_season_keep(
    end: datetime, timezone: str, retention: int, schedule: str | None
) -> float:
    """The shortest time the seasons ending from ``end`` on (the next ``SEASONS_JUDGED``) are
    kept after their end, ``retention`` seasons each: as far as the calendar goes."""
    tz = ZoneInfo(timezone)
    firings = croniter(_season(schedule), end.astimezone(tz))
    ends = [end.timestamp()]
    with contextlib.suppress(*_OUT_OF_CALENDAR):
        for _ in range(SEASONS_JUDGED + retention):
            ends.append(_next_start(firings, tz).timestamp())
    keeps = [ends[k + retention] - ends[k] for k in range(len(ends) - retention)]
    return min(keeps, default=math.inf)
