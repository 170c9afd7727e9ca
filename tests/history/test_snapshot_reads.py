"""The snapshot read (docs/api.md section 7): the newest snapshot a view had taken by a moment,
as the API answers it; the snapshots are taken as the history service takes them
(tests/history/test_snapshots.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import MarkChangedViews
from services.history.snapshotter import Snapshotter
from shared.boards import MAIN_BOARD, Board, BoardCatalog
from shared.db_boards import SnapshotRow, save_snapshots, snapshot_at
from shared.keys import Keys
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.helpers import api_client, player
from tests.history.test_snapshots import LAPS, T1, T2, WEEK, accepted, write_view
from tests.plans import analyze, plans, recorded

SNAPSHOTS = "/v1/boards/main/snapshots"


def rfc(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


async def test_a_snapshot_answers_for_a_time_between_two_takes(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine, snapshotter: Snapshotter
) -> None:
    mark = MarkChangedViews(redis, keys)
    weekly = {"scope": "region:eu", "period": "weekly"}
    async with api_client(quiet) as client:
        before_any = await client.get(SNAPSHOTS, params=weekly | {"at": rfc(T2)})

        await write_view(redis, keys, MAIN_BOARD, "weekly", WEEK, "region:eu", {"u-1": 10})
        await mark([accepted(periods=(("weekly", WEEK),))])
        await snapshotter.take_board(MAIN_BOARD, T1)
        await write_view(
            redis, keys, MAIN_BOARD, "weekly", WEEK, "region:eu", {"u-2": 30, "u-1": 20}
        )
        await mark([accepted("u-2", periods=(("weekly", WEEK),))])
        await snapshotter.take_board(MAIN_BOARD, T2)

        between = await client.get(SNAPSHOTS, params=weekly | {"at": "2026-11-29T18:00:30+01:00"})
        at_first = await client.get(SNAPSHOTS, params=weekly | {"at": rfc(T1)})
        after = await client.get(SNAPSHOTS, params=weekly | {"at": rfc(T2 + timedelta(days=1))})
        latest = await client.get(SNAPSHOTS, params=weekly, headers=player("u-9"))
        too_early = await client.get(
            SNAPSHOTS, params=weekly | {"at": rfc(T1 - timedelta(milliseconds=1))}
        )
        other_week = await client.get(
            SNAPSHOTS, params=weekly | {"at": rfc(T2), "period_id": "2026-W47"}
        )
        other_scope = await client.get(
            SNAPSHOTS, params={"scope": "global", "period": "weekly", "at": rfc(T2)}
        )

    assert_problem(before_any, 404)
    assert between.status_code == 200, between.text
    assert between.json() == {
        "board_id": "main",
        "scope": "region:eu",
        "period": "weekly",
        "period_id": WEEK,
        "taken_at": "2026-11-29T17:00:00.000Z",
        "entries": [
            {"rank": 1, "user_id": "u-1", "score": 10, "display_name": None, "metadata": None}
        ],
    }
    assert at_first.json() == between.json()
    assert after.json()["taken_at"] == "2026-11-29T17:01:00.000Z"
    assert [(e["user_id"], e["score"]) for e in after.json()["entries"]] == [
        ("u-2", 30),
        ("u-1", 20),
    ]
    assert latest.json() == after.json()
    assert_problem(too_early, 404)
    assert_problem(other_week, 404)
    assert_problem(other_scope, 404)


async def test_a_snapshot_answers_its_entries_as_they_were_taken(
    quiet: LadderSettings, redis: Redis, keys: Keys, db: AsyncEngine, snapshotter: Snapshotter
) -> None:
    """Subscores (on a board with a subscore_order) and metadata as the snapshot holds them; an
    entry stored before metadata was kept answers ``metadata: null``, as every entry does."""
    race = Board(board_id="race", operator="best", order="asc", subscore_order="asc")
    kept = {"u-1": {"z": 1, "a": ["ü", None]}}
    old_entry = {"rank": 1, "user_id": "u-9", "score": 3, "display_name": "Old"}
    async with api_client(quiet) as client:
        await BoardCatalog(redis, keys).put(race)
        await write_view(
            redis,
            keys,
            race,
            "alltime",
            "all",
            "region:eu",
            {"u-1": 40, "u-2": 40},
            subscores={"u-1": -MAX_SCORE, "u-2": 0},
            metadata=kept,
        )
        await MarkChangedViews(redis, keys)(
            [accepted(board_id="race", periods=(("alltime", "all"),))]
        )
        await snapshotter.take_board(race, T1)
        await save_snapshots(
            db,
            [
                {
                    "board_id": "main",
                    "scope": "global",
                    "period": "alltime",
                    "period_id": "all",
                    "taken_at": T1,
                    "entries": [old_entry],
                }
            ],
        )
        taken = await client.get("/v1/boards/race/snapshots", params={"scope": "region:eu"})
        old = await client.get(SNAPSHOTS)

    assert taken.status_code == 200, taken.text
    assert taken.json()["entries"] == [
        {
            "rank": 1,
            "user_id": "u-1",
            "score": 40,
            "subscore": -MAX_SCORE,
            "display_name": None,
            "metadata": kept["u-1"],
        },
        {
            "rank": 2,
            "user_id": "u-2",
            "score": 40,
            "subscore": 0,
            "display_name": None,
            "metadata": None,
        },
    ]
    # The metadata object's keys in the order they were sent.
    assert taken.content.find(orjson.dumps(kept["u-1"])) > 0
    assert old.status_code == 200, old.text
    assert old.json()["entries"] == [old_entry | {"metadata": None}]


@pytest.mark.parametrize(
    ("params", "status", "loc"),
    [
        ({"at": "2026-11-29T17:00:00"}, 422, "at"),  # no offset
        ({"at": "yesterday"}, 422, "at"),
        ({"at": "9999-12-31T23:00:00-05:00"}, 422, "at"),
        ({"scope": "friends:u-1"}, 422, "scope"),
        ({"scope": "region:EU"}, 422, "scope"),
        ({"scope": "everyone"}, 422, "scope"),
        ({"period": "hourly"}, 422, "period"),
        ({"period": "weekly", "period_id": "2026-48"}, 422, "period_id"),
        ({"period": "weekly", "period_id": "2026-W48"}, 404, None),
        ({"period": "weekly", "period_id": "2027-W53"}, 422, "period_id"),  # 2027 has 52 weeks
        # Periods that end past the last instant of year 9999 are periods: none was snapshotted.
        ({"period": "weekly", "period_id": "9999-W52"}, 404, None),
        ({"period": "monthly", "period_id": "9999-12"}, 404, None),
        ({"at": "1000-01-01T00:00:00Z"}, 404, None),
    ],
)
async def test_a_bad_snapshot_query_is_a_problem(
    quiet: LadderSettings,
    mysql_database: str,
    params: dict[str, str],
    status: int,
    loc: str | None,
) -> None:
    async with api_client(quiet) as client:
        response = await client.get(SNAPSHOTS, params=params)

    body = assert_problem(response, status)
    if loc is not None:
        assert any(error["loc"][-1] == loc for error in body["errors"]), body


async def test_snapshots_of_an_unknown_board_or_period_are_404(
    quiet: LadderSettings, redis: Redis, keys: Keys, mysql_database: str
) -> None:
    async with api_client(quiet) as client:
        await BoardCatalog(redis, keys).put(LAPS)
        unknown = await client.get("/v1/boards/nope/snapshots")
        not_kept = await client.get("/v1/boards/laps/snapshots", params={"period": "daily"})

    assert_problem(unknown, 404)
    assert_problem(not_kept, 404)


async def test_the_teams_scope_of_a_board_that_sums_no_teams_is_a_422_as_on_its_leaderboard(
    quiet: LadderSettings, redis: Redis, keys: Keys, mysql_database: str
) -> None:
    async with api_client(quiet) as client:
        await BoardCatalog(redis, keys).put(LAPS)
        snapshot = await client.get("/v1/boards/laps/snapshots", params={"scope": "teams"})
        page = await client.get("/v1/boards/laps/leaderboard", params={"scope": "teams"})

    for answer in (snapshot, page):
        body = assert_problem(answer, 422)
        assert body["errors"][0]["loc"] == ["query", "scope"], body


async def test_a_snapshot_of_an_old_period_id_is_read_by_the_unique_key(db: AsyncEngine) -> None:
    """A read naming a period id walks the unique key (the view, its period id, the time), not
    the view's index by time, which it would walk back over every snapshot taken since: 50,000
    snapshots of a view took a read of the oldest day 3.6 s (1 ms by the key)."""
    first = datetime(2026, 11, 1, tzinfo=UTC)
    rows: list[SnapshotRow] = [
        {
            "board_id": "main",
            "scope": "global",
            "period": "daily",
            "period_id": (first + timedelta(hours=hour)).strftime("%Y-%m-%d"),
            "taken_at": first + timedelta(hours=hour),
            "entries": [{"rank": 1, "user_id": f"u-{hour}", "score": hour}],
        }
        for hour in range(24 * 40)
    ]
    await save_snapshots(db, rows)
    await analyze(db, "snapshots")
    end = first + timedelta(days=60)

    with recorded(db, "snapshots") as statements:
        oldest = await snapshot_at(db, "main", "global", "daily", end, "2026-11-01")
        newest = await snapshot_at(db, "main", "global", "daily", end)

    assert oldest is not None and oldest["taken_at"] == "2026-11-01T23:00:00.000Z"
    assert newest is not None and newest["period_id"] == "2026-12-10"
    by_key, by_time = await plans(db, "snapshots", statements)
    assert by_key["key"] == "uq_snapshots_board_id_scope_period_period_id_taken_at", by_key
    assert by_time["key"] == "ix_snapshots_board_id_scope_period_taken_at", by_time
    assert "filesort" not in (by_key["Extra"] or "") + (by_time["Extra"] or "")
