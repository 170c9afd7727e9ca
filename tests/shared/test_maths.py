"""Period and ranking maths, and the pure rules of the notifier and the merge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.aggregator.combine import combine, out_of_range
from services.notifier.rules import crossings, entered
from shared.boards import Board
from shared.events import PeriodResult
from shared.periods import (
    PeriodIdError,
    PeriodOutOfCalendar,
    expire_at,
    previous_window,
    window_at,
    window_of,
)
from shared.ranking import (
    MAX_SCORE,
    TIE_WIDTH,
    id_of,
    member,
    metadata_of,
    parse_member,
    parse_record,
    reached_ms,
    reached_of,
    record,
    score_of,
    signed,
    sub_part,
    subscore_of,
    tie_key,
    written_of,
)

NOON = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("period", "moment", "timezone", "expected"),
    [
        ("daily", NOON, "UTC", "2026-11-29"),
        ("weekly", NOON, "UTC", "2026-W48"),
        ("monthly", NOON, "UTC", "2026-11"),
        ("alltime", NOON, "UTC", "all"),
        # UTC+14: noon on the 29th in UTC is already 02:00 on the 30th, a Monday.
        ("daily", NOON, "Pacific/Kiritimati", "2026-11-30"),
        ("weekly", NOON, "Pacific/Kiritimati", "2026-W49"),
        ("monthly", datetime(2026, 11, 30, 10, 0, tzinfo=UTC), "Pacific/Kiritimati", "2026-12"),
        # ISO weeks: 2027-01-01 is a Friday in week 53 of 2026.
        ("weekly", datetime(2027, 1, 1, 12, tzinfo=UTC), "UTC", "2026-W53"),
        ("weekly", datetime(2027, 1, 4, 0, tzinfo=UTC), "UTC", "2027-W01"),
    ],
)
def test_period_ids(period: str, moment: datetime, timezone: str, expected: str) -> None:
    assert window_at(period, moment, timezone).period_id == expected  # type: ignore[arg-type]


def test_a_day_across_a_dst_change_lasts_23_or_25_hours() -> None:
    spring = window_of("daily", "2026-03-29", "Europe/Berlin")
    autumn = window_of("daily", "2026-10-25", "Europe/Berlin")
    assert spring.end is not None and autumn.end is not None
    assert spring.end - spring.start == timedelta(hours=23)
    assert autumn.end - autumn.start == timedelta(hours=25)


@pytest.mark.parametrize("period", ["daily", "weekly", "monthly"])
def test_window_of_inverts_window_at(period: str) -> None:
    window = window_at(period, NOON, "America/New_York")  # type: ignore[arg-type]
    again = window_of(period, window.period_id, "America/New_York")  # type: ignore[arg-type]
    assert again == window


@pytest.mark.parametrize(
    ("period", "period_id", "timezone"),
    [
        ("daily", "9999-12-31", "UTC"),
        ("weekly", "9999-W52", "UTC"),
        ("monthly", "9999-12", "America/New_York"),
        # Midnight of 1 January of year 1 in UTC+14 is still in year 0 in UTC.
        ("daily", "0001-01-01", "Etc/GMT-14"),
        ("daily", "0001-01-01", "Asia/Tokyo"),
    ],
)
def test_a_period_outside_the_calendar_is_told_from_no_period(
    period: str, period_id: str, timezone: str
) -> None:
    # A period all the same (reads answer 404: not yet begun, or past retention), not an id
    # that names none (422).
    with pytest.raises(PeriodOutOfCalendar, match="outside years 1 to 9999"):
        window_of(period, period_id, timezone)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("period_id", "timezone", "schedule", "a_season"),
    [
        ("9999-12-31T23:59", "UTC", "* * * * *", True),
        ("9999-12-31T23:00", "UTC", "0 * * * *", True),
        ("9999-12-31T18:00", "Europe/Berlin", "0 18 * * 5", True),  # a Friday
        ("0001-01-01T00:00", "Asia/Tokyo", "0 0 * * *", True),
        ("9999-12-31T23:05", "UTC", "0 * * * *", False),
        ("9999-12-30T18:00", "Europe/Berlin", "0 18 * * 5", False),  # a Thursday
    ],
)
def test_a_season_outside_the_calendar_is_one_if_the_schedule_fires_then(
    period_id: str, timezone: str, schedule: str, a_season: bool
) -> None:
    with pytest.raises(PeriodIdError) as raised:
        window_of("season", period_id, timezone, schedule)
    assert isinstance(raised.value, PeriodOutOfCalendar) is a_season, raised.value


def test_a_season_before_the_year_1000_is_named_with_four_digits() -> None:
    season = window_of("season", "0001-01-01T00:00", "UTC", "0 0 1 1 *")
    assert season.period_id == "0001-01-01T00:00"
    assert season.end == datetime(2, 1, 1, tzinfo=UTC)


def test_retention_and_previous_windows() -> None:
    today = window_at("daily", NOON, "UTC")
    assert previous_window(today, "UTC", 2).period_id == "2026-11-27"
    expiry = expire_at(today, "UTC", 35)
    assert expiry == int(datetime(2027, 1, 4, tzinfo=UTC).timestamp())
    assert expire_at(window_at("alltime", NOON, "UTC"), "UTC", None) is None


@given(
    descending=st.booleans(),
    data=st.data(),
)
def test_the_layout_round_trips_and_orders(descending: bool, data: st.DataObject) -> None:
    """Sorted-set score and member (shared/ranking.py) in ZREVRANGE's order: score, then
    member, both descending, is the order of score (best first), then reach time (earliest)."""
    score = st.integers(-MAX_SCORE, MAX_SCORE)
    ms = st.integers(0, 2**48 - 1)
    user = st.sampled_from(["a", "u-1", "zz"])
    (s1, t1, u1), (s2, t2, u2) = (data.draw(st.tuples(score, ms, user)) for _ in range(2))
    e1 = (float(signed(s1, descending)), member(tie_key(t1), u1))
    e2 = (float(signed(s2, descending)), member(tie_key(t2), u2))
    assert score_of(e1[0], descending) == s1 and parse_member(e1[1]) == (tie_key(t1), u1)
    assert reached_of(parse_member(e1[1])[0]) == t1 and id_of(e1[1]) == u1
    assert len(tie_key(t1)) == TIE_WIDTH
    better1 = s1 > s2 if descending else s1 < s2
    if s1 != s2:
        assert (e1 > e2) == better1
    elif t1 != t2:
        assert (e1 > e2) == (t1 < t2), "the earlier of two equal scores ranks higher"


def test_every_score_within_2_to_the_53_is_held() -> None:
    assert MAX_SCORE == 2**53 - 1
    assert float(MAX_SCORE) == MAX_SCORE and float(-MAX_SCORE) == -MAX_SCORE
    assert reached_ms(datetime(2026, 1, 1, tzinfo=UTC)) == 1_767_225_600_000


def result(rank: int, previous: int | None, pushed: dict[str, str] | None = None) -> PeriodResult:
    return PeriodResult(
        period_id="all",
        score=1,
        rank=rank,
        previous_rank=previous,
        improved=True,
        pushed_out=pushed or {},
    )


@pytest.mark.parametrize(
    ("rank", "previous", "expected"),
    [
        (1, None, 1),  # a first score comes from outside every bracket
        (50, None, 100),
        (150, None, None),
        (5, 50, 10),  # crossing 10 (and not 1): one message, the smallest bracket entered
        (1, 500, 1),  # crossing 100, 10 and 1 names 1
        (3, 4, None),  # moving up inside the top 10 enters nothing
        (12, 8, None),  # moving down enters nothing
    ],
)
def test_entered(rank: int, previous: int | None, expected: int | None) -> None:
    assert entered(result(rank, previous), (1, 10, 100)) == expected


def test_each_displaced_user_hears_of_the_bracket_it_left() -> None:
    out = crossings("hero", result(1, 500, {"1": "a", "10": "b", "100": "c"}), (1, 10, 100))
    assert [(c.user_id, c.reason, c.top, c.rank, c.previous_rank) for c in out] == [
        ("hero", "entered_top", 1, 1, 500),
        ("a", "overtaken", 1, 2, 1),
        ("b", "overtaken", 10, 11, 10),
        ("c", "overtaken", 100, 101, 100),
    ]


@pytest.mark.parametrize(
    ("operator", "order", "regional", "expected"),
    [
        # the sum, reached with the latest part, with its metadata
        ("incr", "desc", [(10, 5), (7, 9)], (17, 9)),
        ("best", "desc", [(10, 5), (12, 9), (12, 3)], (12, 3)),  # best, and earliest of equals
        ("best", "asc", [(10, 5), (12, 1)], (10, 5)),  # ascending keeps the lowest
        ("set", "desc", [(10, 5), (3, 9)], (3, 9)),  # the latest value
    ],
)
def test_global_combines_regions(
    operator: str, order: str, regional: list[tuple[int, int]], expected: tuple[int, int]
) -> None:
    board = Board(board_id="b", operator=operator, order=order)  # type: ignore[arg-type]
    # Each regional entry's metadata names its reach time, to see whose the merge keeps.
    entries = [(signed(s, board.descending), tie_key(t), f'{{"t":{t}}}', None) for s, t in regional]
    merged = combine(board.operator, entries)
    assert merged is not None
    score, tie, metadata, _ = merged
    assert (score_of(score, board.descending), reached_of(tie)) == expected
    assert metadata == f'{{"t":{expected[1]}}}'


def test_best_combines_by_score_then_subscore_then_reach() -> None:
    faster, slower = sub_part(30, "asc"), sub_part(45, "asc")
    entries = [
        (3, tie_key(1, slower), "a", None),  # three stars, slow, reached first
        (3, tie_key(9, faster), "b", None),  # three stars, fast, reached later: the better pair
        (2, tie_key(0, sub_part(1, "asc")), "c", None),
    ]
    assert combine("best", entries) == entries[1]


def test_a_global_sum_beyond_the_range_is_held_at_its_end() -> None:
    entries = [(MAX_SCORE, tie_key(0), "a", None), (1, tie_key(5), "b", None)]
    assert combine("incr", entries) == (MAX_SCORE, tie_key(5), "b", None)
    assert out_of_range("incr", entries)
    below = [(-MAX_SCORE, tie_key(7), "a", None), (-2, tie_key(5), "b", None)]
    assert combine("incr", below) == (-MAX_SCORE, tie_key(7), "a", None)
    assert out_of_range("incr", below)
    exact = [(MAX_SCORE, tie_key(0), "", None), (0, tie_key(5), "", None)]
    assert combine("incr", exact) == (MAX_SCORE, tie_key(5), "", None)
    assert not out_of_range("incr", exact)


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_subscore_parts_order_the_better_subscore_greater_across_the_range(order: str) -> None:
    subscores = [-MAX_SCORE, -(10**12), -1, 0, 1, 10**12, MAX_SCORE]
    parts = [sub_part(x, order) for x in subscores]  # type: ignore[arg-type]
    assert len({len(p) for p in parts}) == 1
    # desc: the higher subscore is better; asc: the lower.
    assert parts == sorted(parts, reverse=(order == "asc"))
    for x in subscores:
        tie = tie_key(1_700_000_000_123, sub_part(x, order))  # type: ignore[arg-type]
        raw = member(tie, "u:7")
        assert subscore_of(raw, order) == x  # type: ignore[arg-type]
        assert parse_member(raw) == (tie, "u:7")
        assert id_of(raw) == "u:7"
        assert reached_of(tie) == 1_700_000_000_123


def test_a_record_keeps_tie_score_and_metadata_with_bars_in_it() -> None:
    tie = tie_key(5, sub_part(-3, "asc"))
    raw = record(tie, -MAX_SCORE, '{"note":"a|b"}')
    assert parse_record(raw) == (tie, -MAX_SCORE, '{"note":"a|b"}')
    assert metadata_of(raw) == {"note": "a|b"}
    assert metadata_of(record(tie, 0)) is None
    assert metadata_of(None) is None
    assert written_of(raw) is None


@pytest.mark.parametrize("metadata", ["", '{"note":"a|b"}'])
def test_a_set_record_keeps_its_latest_write_beside_its_reach_time(metadata: str) -> None:
    tie = tie_key(5, sub_part(-3, "asc"))
    raw = record(tie, 7, metadata, written=9)
    assert raw == f"{tie}|7|{tie_key(9)}|{metadata}"
    assert parse_record(raw) == (tie, 7, metadata)
    assert metadata_of(raw) == (orjson.loads(metadata) if metadata else None)
    assert written_of(raw) == 9
    # Written when reached: the record is as one that keeps no latest write.
    assert record(tie, 7, metadata, written=5) == record(tie, 7, metadata)


def test_set_combines_to_the_region_written_last() -> None:
    # eu reached 4 at 0 and set it again at 50, after na set 3 at 20: eu's entry, as it is.
    eu = (4, tie_key(0), '{"r":"eu"}', 50)
    na = (3, tie_key(20), '{"r":"na"}', None)
    assert combine("set", [eu, na]) == eu
    assert combine("set", [na, eu]) == eu
    # A record that keeps no latest write was written when its score was reached.
    assert combine("set", [(4, tie_key(0), "", None), na]) == na
