"""Snapshots (docs/api.md section 7): the history service marks the views each event changed and,
on its ticker, stores their top N in MySQL; the API answers the newest taken by a moment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history import main as history_main
from services.history.handlers import MarkChangedViews
from services.history.snapshotter import Snapshotter, tick, view_member
from shared.boards import MAIN_BOARD, Board, BoardCatalog
from shared.db import open_engine
from shared.db_boards import snapshot_at
from shared.events import PeriodResult, ScoreAccepted, message_body
from shared.keys import Keys
from shared.periods import Period
from shared.ranking import member, signed, tie_key
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.api.helpers import assert_problem
from tests.helpers import api_client, eventually, player
from tests.stack import free_port

T1 = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
T2 = T1 + timedelta(minutes=1)
WEEK = "2026-W48"
LAPS = Board(board_id="laps", operator="best", order="asc", periods=("weekly", "alltime"))


# --- helpers ---------------------------------------------------------------------------------


def accepted(
    user_id: str = "u-1",
    *,
    board_id: str = "main",
    region: str = "eu",
    team_id: str | None = None,
    periods: tuple[tuple[Period, str], ...] = (("weekly", WEEK), ("alltime", "all")),
) -> ScoreAccepted:
    """An event as the history consumer receives it (the scores themselves do not matter)."""
    return ScoreAccepted(
        event_id=uuid.uuid4().hex,
        board_id=board_id,
        user_id=user_id,
        region=region,
        team_id=team_id,
        value=1,
        occurred_at=T1,
        accepted_at=T1,
        periods={
            period: PeriodResult(
                period_id=period_id, score=1, rank=1, previous_rank=None, improved=True
            )
            for period, period_id in periods
        },
    )


async def write_view(
    redis: Redis,
    keys: Keys,
    board: Board,
    period: Period,
    period_id: str,
    scope: str,
    scores: dict[str, int],
) -> None:
    """Scores into a view as the atomic write (or the aggregator) leaves them, reached in the
    order given: an earlier member wins a tie."""
    view = keys.board_view(board.board_id, period, period_id, scope)
    ties = {entry: tie_key(1_700_000_000_000 + ms) for ms, entry in enumerate(scores)}
    members = {
        member(ties[entry], entry): signed(score, board.descending)
        for entry, score in scores.items()
    }
    old = await redis.hmget(Keys.ties(view), list(ties))
    gone = [member(tie, entry) for tie, entry in zip(old, ties, strict=True) if tie is not None]
    if gone:
        await redis.zrem(view, *gone)
    await redis.zadd(view, members)
    await redis.hset(Keys.ties(view), mapping=ties)


@pytest.fixture
async def db(settings: LadderSettings, mysql_database: str) -> AsyncIterator[AsyncEngine]:
    async with open_engine(settings.mysql_url) as engine:
        yield engine


@pytest.fixture
def snapshotter(redis: Redis, keys: Keys, db: AsyncEngine, settings: LadderSettings) -> Snapshotter:
    return Snapshotter(redis, keys, db, size=3)


async def dirty(redis: Redis, keys: Keys, board_id: str = "main") -> set[str]:
    members: set[Any] = await redis.smembers(keys.snapshot_dirty(board_id))
    return members


# --- marking the views that changed ----------------------------------------------------------


async def test_an_event_marks_its_region_global_and_team_in_each_period(
    redis: Redis, keys: Keys
) -> None:
    mark = MarkChangedViews(redis, keys)

    await mark([accepted(team_id="red"), accepted("u-2", region="us")])
    await mark([accepted(team_id="red")])  # a redelivery marks nothing new
    await mark([accepted(board_id="laps", periods=(("alltime", "all"),))])

    assert await dirty(redis, keys) == {
        view_member(period, period_id, scope)
        for period, period_id in (("weekly", WEEK), ("alltime", "all"))
        for scope in ("region:eu", "region:us", "global", "teams")
    }
    assert await dirty(redis, keys, "laps") == {
        "alltime|all|region:eu",
        "alltime|all|global",
    }


# --- taking snapshots ------------------------------------------------------------------------


async def test_a_pass_stores_the_top_n_of_each_changed_view(
    redis: Redis, keys: Keys, db: AsyncEngine, snapshotter: Snapshotter
) -> None:
    board = MAIN_BOARD
    await write_view(
        redis, keys, board, "weekly", WEEK, "region:eu", {"u-1": 50, "u-2": 70, "u-3": 50, "u-4": 9}
    )
    await write_view(redis, keys, board, "weekly", WEEK, "teams", {"red": 120, "blue": 130})
    await redis.hset(keys.names("main"), mapping={"u-1": "Ana", "u-2": "Bo"})
    await MarkChangedViews(redis, keys)([accepted(team_id="red", periods=(("weekly", WEEK),))])

    # The global view is empty: the aggregator has not merged yet.
    assert await snapshotter.take_board(board, T1) == 2

    region = await snapshot_at(db, "main", "region:eu", "weekly", T1)
    assert region == {
        "board_id": "main",
        "scope": "region:eu",
        "period": "weekly",
        "period_id": WEEK,
        "taken_at": "2026-11-29T17:00:00.000Z",
        "entries": [
            {"rank": 1, "user_id": "u-2", "score": 70, "display_name": "Bo"},
            {"rank": 2, "user_id": "u-1", "score": 50, "display_name": "Ana"},
            {"rank": 3, "user_id": "u-3", "score": 50, "display_name": None},
        ],
    }
    teams = await snapshot_at(db, "main", "teams", "weekly", T1)
    assert teams is not None
    assert teams["entries"] == [
        {"rank": 1, "team_id": "blue", "score": 130},
        {"rank": 2, "team_id": "red", "score": 120},
    ]
    assert await snapshot_at(db, "main", "global", "weekly", T1) is None
    # The global view is taken again on the next pass, once the merge has landed.
    assert await dirty(redis, keys) == {view_member("weekly", WEEK, "global", follow_up=True)}

    await write_view(redis, keys, board, "weekly", WEEK, "global", {"u-2": 70})
    assert await snapshotter.take_board(board, T2) == 1
    merged = await snapshot_at(db, "main", "global", "weekly", T2)
    assert merged is not None
    assert merged["entries"] == [{"rank": 1, "user_id": "u-2", "score": 70, "display_name": "Bo"}]
    # A follow-up is not followed up again; nothing changed, nothing is taken.
    assert await dirty(redis, keys) == set()
    assert await snapshotter.take_board(board, T2 + timedelta(minutes=1)) == 0


async def test_an_ascending_board_decodes_its_scores(
    redis: Redis, keys: Keys, db: AsyncEngine, snapshotter: Snapshotter
) -> None:
    await write_view(redis, keys, LAPS, "alltime", "all", "region:eu", {"u-1": 58, "u-2": 61})
    await MarkChangedViews(redis, keys)([accepted(board_id="laps", periods=(("alltime", "all"),))])

    await snapshotter.take_board(LAPS, T1)

    found = await snapshot_at(db, "laps", "region:eu", "alltime", T1)
    assert found is not None
    assert [(e["user_id"], e["score"]) for e in found["entries"]] == [("u-1", 58), ("u-2", 61)]


async def test_a_pass_cut_short_is_taken_again(
    redis: Redis, keys: Keys, db: AsyncEngine, snapshotter: Snapshotter
) -> None:
    await write_view(redis, keys, MAIN_BOARD, "alltime", "all", "region:eu", {"u-1": 5})
    await MarkChangedViews(redis, keys)([accepted(periods=(("alltime", "all"),))])
    # A pass renamed the set aside and died before storing anything; a new mark came since.
    await redis.rename(keys.snapshot_dirty("main"), keys.snapshot_dirty("main", taking=True))
    await MarkChangedViews(redis, keys)([accepted(region="us", periods=(("alltime", "all"),))])
    await write_view(redis, keys, MAIN_BOARD, "alltime", "all", "region:us", {"u-1": 7})

    assert await snapshotter.take_board(MAIN_BOARD, T1) == 1  # the pass left behind: eu
    assert await snapshotter.take_board(MAIN_BOARD, T2) == 1  # then the newer mark: us

    assert await snapshot_at(db, "main", "region:eu", "alltime", T1) is not None
    assert await snapshot_at(db, "main", "region:us", "alltime", T1) is None
    assert await snapshot_at(db, "main", "region:us", "alltime", T2) is not None
    assert not await redis.exists(keys.snapshot_dirty("main", taking=True))


async def test_the_ticker_takes_every_board_until_stopped(
    redis: Redis, keys: Keys, db: AsyncEngine, snapshotter: Snapshotter
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    await catalog.put(LAPS)
    await write_view(redis, keys, MAIN_BOARD, "alltime", "all", "region:eu", {"u-1": 5})
    await write_view(redis, keys, LAPS, "alltime", "all", "region:eu", {"u-1": 60})
    stop = asyncio.Event()
    ticker = asyncio.create_task(tick(snapshotter, catalog, 0.05, stop))
    try:
        await MarkChangedViews(redis, keys)(
            [
                accepted(periods=(("alltime", "all"),)),
                accepted(board_id="laps", periods=(("alltime", "all"),)),
            ]
        )
        now = datetime.now(UTC) + timedelta(seconds=1)

        async def both() -> bool:
            return all(
                [
                    await snapshot_at(db, board, "region:eu", "alltime", now)
                    for board in ("main", "laps")
                ]
            )

        await eventually(both)
    finally:
        stop.set()
        await asyncio.wait_for(ticker, 5)


async def test_the_history_service_snapshots_what_it_consumes(
    settings: LadderSettings, redis: Redis, keys: Keys, broker: Topology, db: AsyncEngine
) -> None:
    service_settings = settings.model_copy(
        update={"history_port": free_port(), "snapshot_interval": 0.1}
    )
    await BoardCatalog(redis, keys).ensure_defaults()
    await write_view(redis, keys, MAIN_BOARD, "alltime", "all", "region:eu", {"u-1": 5})
    connection = await aio_pika.connect(settings.amqp_url)
    service = asyncio.create_task(history_main.run(service_settings))
    try:
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await broker.declare(channel)
            exchange = await channel.get_exchange(broker.scores_exchange)
            body = message_body([accepted(periods=(("alltime", "all"),)).model_dump_json()])
            await exchange.publish(
                aio_pika.Message(body, content_type="application/json", message_id="m-1"),
                routing_key="",
            )

        async def taken() -> dict[str, Any] | None:
            found = await snapshot_at(
                db, "main", "region:eu", "alltime", datetime.now(UTC) + timedelta(seconds=1)
            )
            return dict(found) if found else None

        snapshot = await eventually(taken, within=15)
        assert snapshot["entries"] == [
            {"rank": 1, "user_id": "u-1", "score": 5, "display_name": None}
        ]
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(asyncio.shield(service), 15)
    finally:
        if not service.done():
            service.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await service


# --- the API ---------------------------------------------------------------------------------


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
        "entries": [{"rank": 1, "user_id": "u-1", "score": 10, "display_name": None}],
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
