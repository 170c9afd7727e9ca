"""Seasons: the windows of a board's schedule, their ids, and what a definition accepts."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from shared.boards import BoardSpec, StoredSpec
from shared.periods import (
    PeriodIdError,
    PeriodRangeError,
    expire_at,
    previous_window,
    retention_error,
    window_at,
    window_of,
    windows_before,
)

FRIDAYS = "0 18 * * 5"


def test_a_season_runs_from_one_firing_to_the_next_in_the_boards_timezone() -> None:
    # Wednesday 2 December 2026, 12:00 UTC: in Berlin (UTC+1) the season began Friday 27th 18:00.
    moment = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    season = window_at("season", moment, "Europe/Berlin", FRIDAYS)
    assert season.period_id == "2026-11-27T18:00"
    assert season.start == datetime(2026, 11, 27, 17, 0, tzinfo=UTC)
    assert season.end == datetime(2026, 12, 4, 17, 0, tzinfo=UTC)
    assert window_of("season", "2026-11-27T18:00", "Europe/Berlin", FRIDAYS) == season
    # A firing belongs to the season it starts.
    assert window_at("season", season.end, "Europe/Berlin", FRIDAYS).period_id == (
        "2026-12-04T18:00"
    )
    before = previous_window(season, "Europe/Berlin", 2, FRIDAYS)
    assert before.period_id == "2026-11-13T18:00"
    # Kept 12 seasons after it ends.
    assert expire_at(season, "Europe/Berlin", 12, FRIDAYS) == int(
        datetime(2027, 2, 26, 17, 0, tzinfo=UTC).timestamp()
    )


def test_a_minute_schedule_is_a_season_a_minute() -> None:
    moment = datetime(2026, 12, 2, 0, 30, 59, 999_000, tzinfo=UTC)
    season = window_at("season", moment, "UTC", "* * * * *")
    assert (season.period_id, season.start, season.end) == (
        "2026-12-02T00:30",
        datetime(2026, 12, 2, 0, 30, tzinfo=UTC),
        datetime(2026, 12, 2, 0, 31, tzinfo=UTC),
    )


@pytest.mark.parametrize(
    "period_id", ["2026-12-04T18:01", "2026-12-03T18:00", "2026-13-04T18:00", "2026-12-04"]
)
def test_an_id_that_is_no_start_of_the_schedule_names_no_season(period_id: str) -> None:
    with pytest.raises(PeriodIdError):
        window_of("season", period_id, "UTC", FRIDAYS)


def test_a_season_needs_a_schedule() -> None:
    with pytest.raises(PeriodIdError):
        window_of("season", "2026-12-04T18:00", "UTC", None)


def test_a_schedule_adds_the_season_period_and_bad_ones_are_refused() -> None:
    spec = BoardSpec(schedule=" 0  18 * * 5 ", periods=("weekly",))
    assert spec.periods == ("weekly", "season")
    assert spec.schedule == FRIDAYS
    assert spec.retention.season == 12
    assert BoardSpec().schedule is None
    assert "season" not in BoardSpec().periods
    # R and H: croniter picks another time at every reading (seasons would differ by process).
    bad = ("* * * *", "* * * * * *", "@daily", "61 * * * *", "0 0 31 2 *", "x", "R R * * *")
    for schedule in (*bad, "0 H * * *", "0,r 12 * * *"):
        with pytest.raises(ValidationError):
            BoardSpec(schedule=schedule)
    with pytest.raises(ValidationError):
        BoardSpec(periods=("daily", "season"))
    # H needs a hash id croniter was never given, so no stored definition holds it: refused
    # with its cause however the definition is read, where a stored one's was "not a cron
    # expression" (R stays readable there: a board stored with it keeps it).
    for spec in (BoardSpec, StoredSpec):
        with pytest.raises(ValidationError, match="uses R or H"):
            spec(schedule="H * * * *")
    assert StoredSpec(schedule="R 0 * * *").schedule == "R 0 * * *"
    assert BoardSpec(schedule="0 12 * MAR,APR FRI,THU").schedule == "0 12 * MAR,APR FRI,THU"


def test_a_timezone_is_an_iana_name_not_a_host_s_file() -> None:
    assert BoardSpec(timezone="Pacific/Kiritimati").timezone == "Pacific/Kiritimati"
    for name in ("localtime", "posixrules", "Factory", "Mars/Olympus"):
        with pytest.raises(ValidationError, match="unknown timezone"):
            BoardSpec(timezone=name)


@pytest.mark.parametrize(
    ("schedule", "timezone", "retention"),
    [
        (FRIDAYS, "Europe/Berlin", 12),
        ("30 1 * * *", "Europe/Berlin", 200),  # 01:30 daily, over both of 2027's DST changes
        ("0 * * * *", "America/New_York", 3000),  # hourly, over the autumn and spring changes
        ("*/7 * * * *", "Asia/Kolkata", 500),
    ],
)
def test_a_season_s_expiry_is_its_retention_in_seasons_after_its_end(
    schedule: str, timezone: str, retention: int
) -> None:
    # Season by season with window_at(), as every other period's expiry is walked.
    season = window_at("season", datetime(2026, 10, 20, 12, 0, tzinfo=UTC), timezone, schedule)
    end = season.end
    for _ in range(retention):
        assert end is not None
        end = window_at("season", end, timezone, schedule).end
    assert end is not None
    assert expire_at(season, timezone, retention, schedule) == int(end.timestamp())


def test_a_long_retention_of_minute_seasons_costs_a_fraction_of_a_walk_season_by_season() -> None:
    # A board may keep 10,000 seasons of a minute: its expiry is worked out at every new season
    # in every process. One walk of the schedule, against window_at() season by season (two
    # croniters each), timed in the same run: about a tenth on the test machine.
    season = window_at("season", datetime(2026, 12, 2, tzinfo=UTC), "UTC", "* * * * *")
    started = time.process_time()
    end = season.end
    for _ in range(2_000):
        assert end is not None
        end = window_at("season", end, "UTC", "* * * * *").end
    walked = time.process_time() - started
    started = time.process_time()
    expiry = expire_at(season, "UTC", 2_000, "* * * * *")
    once = time.process_time() - started
    assert end is not None and expiry == int(end.timestamp())
    assert once < walked / 2
    assert expire_at(season, "UTC", 10_000, "* * * * *") == int(
        datetime(2026, 12, 8, 22, 41, tzinfo=UTC).timestamp()
    )


@pytest.mark.parametrize(
    ("schedule", "timezone"),
    [("30 1 * * *", "Europe/Berlin"), ("0 * * * *", "America/New_York"), (FRIDAYS, "UTC")],
)
def test_the_seasons_before_one_are_those_window_at_finds_step_by_step(
    schedule: str, timezone: str
) -> None:
    # Through both of 2026's DST changes (Berlin: 29 March, 25 October; New York: 8 March,
    # 1 November), back from December.
    current = window_at("season", datetime(2026, 12, 2, 12, tzinfo=UTC), timezone, schedule)
    walked, window = [], current
    for _ in range(400):
        assert window.start is not None
        window = window_at("season", window.start - timedelta(seconds=1), timezone, schedule)
        walked.append(window)
    assert list(windows_before(current, timezone, 400, schedule)) == walked
    assert previous_window(current, timezone, 400, schedule) == walked[-1]


def test_walks_past_the_calendar_end_instead_of_failing() -> None:
    yearly = "0 0 1 1 *"
    current = window_at("season", datetime(2026, 12, 2, tzinfo=UTC), "UTC", yearly)
    assert expire_at(current, "UTC", 10_000, yearly) is None  # past 9999: kept for good
    assert len(list(windows_before(current, "UTC", 10_000, yearly))) == 2025  # back to year 1
    with pytest.raises(PeriodRangeError):
        previous_window(current, "UTC", 10_000, yearly)


@pytest.mark.parametrize(
    ("schedule", "retention", "error"),
    [
        ("0 0 1 1 *", 10_000, "after the year 9999"),
        ("0 0 1 1 *", 5_000, "before the year 1"),
        ("* * * * *", 3, "until its close"),
        ("* * * * *", 12, None),
        (FRIDAYS, 12, None),
    ],
)
def test_a_retention_must_stay_in_the_calendar_and_outlast_the_close(
    schedule: str, retention: int, error: str | None
) -> None:
    found = retention_error(
        "season", "UTC", retention, schedule, datetime(2026, 12, 2, tzinfo=UTC), outlast=663.0
    )
    assert (found is None) if error is None else (found is not None and error in found)


@pytest.mark.parametrize("minute", [0, 30], ids=["in-the-one-minute-season", "in-the-long-one"])
def test_a_retention_is_judged_on_the_shortest_keep_of_seasons_to_come(minute: int) -> None:
    # Seasons of one minute (hh:00) and of 59 (hh:01 to the next hour), each kept one season
    # after its end: a long season goes a minute after it ends, before its close. Refused
    # whichever season runs when the definition is put (it was accepted during a short one).
    now = datetime(2026, 12, 5, 21, minute, 3, tzinfo=UTC)
    found = retention_error("season", "UTC", 1, "0,1 * * * *", now, outlast=663.0)
    assert found is not None and "60 s after its end" in found, found


def test_the_hour_clocks_go_back_starts_no_season_of_its_own() -> None:
    # New York, 1 November 2026: 01:30 comes twice (05:30 and 06:30 UTC). The second firing
    # starts no season: the season of 01:30 runs 25 hours, and no id names two seasons.
    daily = "30 1 * * *"
    season = window_at(
        "season", datetime(2026, 11, 1, 6, 45, tzinfo=UTC), "America/New_York", daily
    )
    assert season.period_id == "2026-11-01T01:30"
    assert season.start == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    assert season.end == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)
    assert window_of("season", "2026-11-01T01:30", "America/New_York", daily) == season


@pytest.mark.parametrize(
    ("timezone", "schedule", "changes"),
    [
        # Clocks back an hour (the wall-clock hour repeats), forward an hour, and Lord Howe
        # Island's half hour both ways; hourly, sub-hourly, daily and weekly schedules.
        ("America/New_York", "0 * * * *", ["2026-03-08T07:00Z", "2026-11-01T06:00Z"]),
        ("Europe/Berlin", "*/20 * * * *", ["2026-03-29T01:00Z", "2026-10-25T01:00Z"]),
        ("America/Santiago", "45 0,1,2 * * *", ["2026-04-05T03:00Z", "2026-09-06T04:00Z"]),
        ("Australia/Lord_Howe", "*/20 * * * *", ["2026-04-04T15:00Z", "2026-10-03T15:30Z"]),
        ("America/New_York", "15 1 * * 0", ["2026-11-01T06:00Z"]),
    ],
)
def test_seasons_tile_time_with_one_id_each_across_a_change_of_offset(
    timezone: str, schedule: str, changes: list[str]
) -> None:
    for change in changes:
        moment = datetime.fromisoformat(change.replace("Z", "+00:00"))
        seasons = [window_at("season", moment - timedelta(hours=30), timezone, schedule)]
        while seasons[-1].start < moment + timedelta(hours=30) or len(seasons) < 5:
            seasons.append(window_at("season", seasons[-1].end, timezone, schedule))  # type: ignore[arg-type]
        ids = [s.period_id for s in seasons]
        assert ids == sorted(set(ids)), ids
        for before, after in itertools.pairwise(seasons):
            assert before.end == after.start
        for season in seasons:
            assert window_of("season", season.period_id, timezone, schedule) == season
            assert season.end is not None
            inside = season.start + (season.end - season.start) / 2
            assert window_at("season", inside, timezone, schedule) == season
        walked = list(windows_before(seasons[-1], timezone, len(seasons) - 1, schedule))
        assert walked == seasons[-2::-1]
        assert expire_at(seasons[0], timezone, 3, schedule) == seasons[3].end.timestamp()  # type: ignore[union-attr]
