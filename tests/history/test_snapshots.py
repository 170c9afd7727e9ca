"""Snapshots (docs/api.md section 7): the history service marks the views each event changed and,
on its ticker, stores their top N in MySQL; the API answers the newest taken by a moment."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import orjson
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history import main as history_main
from services.history.handlers import MarkChangedViews
from services.history.snapshotter import Snapshotter, tick, view_member
from shared.amqp import connect as connect_broker
from shared.boards import MAIN_BOARD, Board, BoardCatalog
from shared.db_boards import SnapshotRow, save_snapshots, snapshot_at
from shared.events import PeriodResult, ScoreAccepted, message_body
from shared.keys import Keys
from shared.periods import Period
from shared.ranking import MAX_SCORE, member, parse_record, record, signed, sub_part, tie_key
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import eventually, in_process, sigterm
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
    *,
    subscores: dict[str, int] | None = None,
    metadata: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Scores into a view as the atomic write (or the aggregator) leaves them, reached in the
    order given: an earlier member wins a tie. Each id's record in the view's hash holds its
    tie key (with its subscore, on a board with a ``subscore_order``), its signed score and its
    metadata, if given (shared/ranking.py)."""
    view = keys.board_view(board.board_id, period, period_id, scope)
    subs, kept = subscores or {}, metadata or {}
    ties = {
        entry: tie_key(1_700_000_000_000 + ms, sub_part(subs.get(entry), board.subscore_order))
        for ms, entry in enumerate(scores)
    }
    members = {
        member(ties[entry], entry): signed(score, board.descending)
        for entry, score in scores.items()
    }
    records = {
        entry: record(
            ties[entry],
            signed(score, board.descending),
            orjson.dumps(kept[entry]).decode() if entry in kept else "",
        )
        for entry, score in scores.items()
    }
    old = await redis.hmget(Keys.ties(view), list(ties))
    gone = [
        member(parse_record(raw)[0], entry)
        for raw, entry in zip(old, ties, strict=True)
        if raw is not None
    ]
    if gone:
        await redis.zrem(view, *gone)
    await redis.zadd(view, members)
    await redis.hset(Keys.ties(view), mapping=records)


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
            {"rank": 1, "user_id": "u-2", "score": 70, "display_name": "Bo", "metadata": None},
            {"rank": 2, "user_id": "u-1", "score": 50, "display_name": "Ana", "metadata": None},
            {"rank": 3, "user_id": "u-3", "score": 50, "display_name": None, "metadata": None},
        ],
    }
    teams = await snapshot_at(db, "main", "teams", "weekly", T1)
    assert teams is not None
    assert teams["entries"] == [
        {"rank": 1, "team_id": "blue", "score": 130, "metadata": None},
        {"rank": 2, "team_id": "red", "score": 120, "metadata": None},
    ]
    assert await snapshot_at(db, "main", "global", "weekly", T1) is None
    # The global view is taken again on the next pass, once the merge has landed.
    assert await dirty(redis, keys) == {view_member("weekly", WEEK, "global", follow_up=True)}

    await write_view(redis, keys, board, "weekly", WEEK, "global", {"u-2": 70})
    assert await snapshotter.take_board(board, T2) == 1
    merged = await snapshot_at(db, "main", "global", "weekly", T2)
    assert merged is not None
    assert merged["entries"] == [
        {"rank": 1, "user_id": "u-2", "score": 70, "display_name": "Bo", "metadata": None}
    ]
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


async def test_entries_carry_their_metadata_and_on_a_subscore_board_their_subscore(
    redis: Redis, keys: Keys, db: AsyncEngine, snapshotter: Snapshotter
) -> None:
    """As a leaderboard read shows them (docs/api.md section 5): every user entry its metadata
    (null when none) from the view's records, and on a board with a subscore_order its
    subscore, from its member; the board's other views and boards without one are untouched."""
    race = Board(board_id="race", operator="best", order="asc", subscore_order="desc")
    kept = {"u-1": {"car": "ü", "laps": [1, 2.5]}, "u-3": {}}
    # u-2 ties u-1's time with a better subscore, reached later; u-3 is slower at the bound.
    times, subs = {"u-1": 58, "u-2": 58, "u-3": 61}, {"u-1": 3, "u-2": 5, "u-3": -MAX_SCORE}
    for scope in ("region:eu", "global"):
        await write_view(
            redis, keys, race, "alltime", "all", scope, times, subscores=subs, metadata=kept
        )
    await write_view(
        redis, keys, MAIN_BOARD, "alltime", "all", "region:eu", {"u-1": 5}, metadata=kept
    )
    await redis.hset(keys.names("race"), "u-1", "Ana")
    await MarkChangedViews(redis, keys)(
        [
            accepted(board_id="race", periods=(("alltime", "all"),)),
            accepted(periods=(("alltime", "all"),)),
        ]
    )

    assert await snapshotter.take_board(race, T1) == 2
    assert await snapshotter.take_board(MAIN_BOARD, T1) == 1

    want = [
        {"rank": 1, "user_id": "u-2", "score": 58, "subscore": 5, "display_name": None},
        {"rank": 2, "user_id": "u-1", "score": 58, "subscore": 3, "display_name": "Ana"},
        {"rank": 3, "user_id": "u-3", "score": 61, "subscore": -MAX_SCORE, "display_name": None},
    ]
    for entry in want:
        entry["metadata"] = kept.get(entry["user_id"])
    for scope in ("region:eu", "global"):
        taken = await snapshot_at(db, "race", scope, "alltime", T1)
        assert taken is not None
        assert taken["entries"] == want, scope
    plain = await snapshot_at(db, "main", "region:eu", "alltime", T1)
    assert plain is not None
    assert plain["entries"] == [
        {"rank": 1, "user_id": "u-1", "score": 5, "display_name": None, "metadata": kept["u-1"]}
    ]


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
    connection = await connect_broker(settings.amqp_urls)
    async with in_process(history_main.run(service_settings), 15) as service:
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
            {"rank": 1, "user_id": "u-1", "score": 5, "display_name": None, "metadata": None}
        ]
        await sigterm(service, 15)


async def test_snapshots_with_full_metadata_are_stored_in_statements_mysql_takes(
    db: AsyncEngine,
) -> None:
    """Twenty views of 1000 entries, each with 1 KiB of metadata: some 21 MiB, past MariaDB's
    default 16 MiB max_allowed_packet in one statement, so save_snapshots cuts them by size."""
    entries = [
        {
            "rank": r,
            "user_id": f"u-{r}",
            "score": r,
            "display_name": None,
            "metadata": {"m": "x" * 1016},
        }
        for r in range(1, 1001)
    ]
    rows: list[SnapshotRow] = [
        {
            "board_id": "main",
            "scope": f"region:r{i}",
            "period": "alltime",
            "period_id": "all",
            "taken_at": T1,
            "entries": entries,
        }
        for i in range(20)
    ]

    await save_snapshots(db, rows)

    for i in (0, 19):
        found = await snapshot_at(db, "main", f"region:r{i}", "alltime", T1)
        assert found is not None
        assert found["entries"] == entries
