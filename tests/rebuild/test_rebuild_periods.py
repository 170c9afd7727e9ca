"""A rebuild after the board's periods or schedule changed: each stored event is replayed into
the periods its live write put it in (``score_events.periods``), not into those the definition
gives it now, so the rebuilt keys equal the live ones (docs/reliability.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import HistoryHandler
from services.rebuild.rebuilder import Rebuilder
from shared.boards import Board, BoardCatalog
from shared.db import score_events
from shared.db_boards import save_board
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.periods import Period
from shared.settings import LadderSettings
from shared.submit import FORMER_SEASON_TTL
from tests.helpers import derive, read_view
from tests.rebuild.test_rebuild import FEED_LENGTH, eu, outbox_events, projection, relay, write


async def define(redis: Redis, keys: Keys, db: AsyncEngine, board: Board) -> None:
    """A board put as the API's PUT puts it: MySQL, then the Redis catalog."""
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)


async def start(redis: Redis, keys: Keys, db: AsyncEngine, board: Board) -> None:
    # Board main is in the history database from its migration: in Redis too, as at start-up.
    await BoardCatalog(redis, keys).put(Board(board_id="main"))
    await define(redis, keys, db, board)


def written_to(event: ScoreAccepted, period: Period) -> str:
    """The id of the ``period`` the live write put ``event`` in."""
    return event.periods[period].period_id


async def written_across(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine, before: Board, after: Board
) -> tuple[ScoreAccepted, ScoreAccepted]:
    """e1 (u1 scores 5) written under the definition ``before``, then e2 (u2 scores 3) under
    ``after`` (a PUT between the two), each relayed to the history database."""
    await start(redis, keys, db, before)
    at = datetime.now(UTC) - timedelta(seconds=1)
    await write(redis, keys, settings, before, **eu("e1", "u1", 5, at.isoformat()))
    [e1] = await outbox_events(redis, keys, before)
    await relay(redis, keys, db, before)
    await define(redis, keys, db, after)
    await write(redis, keys, settings, after, **eu("e2", "u2", 3, datetime.now(UTC).isoformat()))
    [e2] = await outbox_events(redis, keys, after)
    await relay(redis, keys, db, after)
    return e1, e2


async def rebuilt_equals_live(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> dict[str, Any]:
    """Rebuild every board; assert it made every key as it was, in one attempt. Returns the
    projection."""
    live = await projection(redis, settings)
    done = await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()
    rebuilt = await projection(redis, settings)
    differ = sorted(k for k in live.keys() | rebuilt.keys() if live.get(k) != rebuilt.get(k))
    assert differ == []
    assert all(d.attempts == 1 and d.refused == 0 for d in done)
    return rebuilt


async def test_a_changed_schedule_rebuilds_each_season_as_it_was_written(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Minute seasons, then hourly ones (a PUT between two events): the event of the minute
    season stays there and the hourly season holds the later one alone, live and rebuilt; the
    minute season's keys, which live still holds, are made again."""
    minutes = Board(board_id="sch", schedule="* * * * *", periods=("alltime",))
    hours = Board(board_id="sch", schedule="0 * * * *", periods=("alltime",))
    e1, e2 = await written_across(redis, keys, settings, db, minutes, hours)
    minute = keys.region_view("sch", "season", written_to(e1, "season"), "eu")
    hour = keys.region_view("sch", "season", written_to(e2, "season"), "eu")
    if minute != hour:  # e1 not in the minute that starts e2's hour
        assert await read_view(redis, hour, True) == [("u2", 3)]

    await rebuilt_equals_live(redis, keys, settings, db)

    assert ("u1", 5) in await read_view(redis, minute, True)
    assert ("u2", 3) in await read_view(redis, hour, True)
    if minute != hour:
        # Kept a day past its event, as the aggregator keeps a former schedule's season.
        assert FORMER_SEASON_TTL - 60 < await redis.ttl(minute) <= FORMER_SEASON_TTL


async def test_a_period_added_holds_only_the_events_written_since(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    before = Board(board_id="per", periods=("alltime",))
    after = Board(board_id="per", periods=("daily", "alltime"))
    _, e2 = await written_across(redis, keys, settings, db, before, after)
    day = keys.region_view("per", "daily", written_to(e2, "daily"), "eu")
    assert await read_view(redis, day, True) == [("u2", 3)]

    await rebuilt_equals_live(redis, keys, settings, db)

    assert await read_view(redis, day, True) == [("u2", 3)]


async def test_a_period_dropped_keeps_what_was_written_to_it(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """A period taken off the board keeps its keys live until they expire (it is read again if
    the period comes back): the rebuild makes them again too."""
    before = Board(board_id="per", periods=("daily", "alltime"))
    after = Board(board_id="per", periods=("alltime",))
    e1, _ = await written_across(redis, keys, settings, db, before, after)

    await rebuilt_equals_live(redis, keys, settings, db)

    day = keys.region_view("per", "daily", written_to(e1, "daily"), "eu")
    assert await read_view(redis, day, True) == [("u1", 5)]


async def test_a_former_season_past_its_day_is_not_made_again(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """A season of a former schedule whose last event was accepted more than a day before the
    rebuild is gone from the rebuilt board, and its live event counter (its schedule kept it
    longer) does not hold the rebuild back as an event lost."""
    minutes = Board(board_id="sch", schedule="* * * * *", periods=("alltime",))
    hours = Board(board_id="sch", schedule="0 * * * *", periods=("alltime",))
    await start(redis, keys, db, minutes)
    at = datetime.now(UTC) - timedelta(seconds=1)
    await write(redis, keys, settings, minutes, **eu("e1", "u1", 5, at.isoformat()))
    [e1] = await outbox_events(redis, keys, minutes)
    await redis.delete(keys.outbox("sch"))
    await derive(redis, keys, minutes, [e1], FEED_LENGTH)
    # Stored as accepted two days ago.
    await HistoryHandler(db)([e1.model_copy(update={"accepted_at": at - timedelta(days=2)})])
    await define(redis, keys, db, hours)
    await write(redis, keys, settings, hours, **eu("e2", "u2", 3, datetime.now(UTC).isoformat()))
    [e2] = await outbox_events(redis, keys, hours)
    await relay(redis, keys, db, hours)
    season = written_to(e1, "season")
    minute = keys.region_view("sch", "season", season, "eu")
    counter = keys.event_count("sch", "season", season)
    if season == written_to(e2, "season"):
        return  # e1 in the minute that starts e2's hour: no former season
    assert await redis.exists(minute, counter) == 2

    [done] = await Rebuilder(db, redis, keys, settings, wait_seconds=5).run(["sch"])

    assert (done.attempts, done.events) == (1, 2)
    assert await redis.exists(minute, counter) == 0
    hour = keys.region_view("sch", "season", written_to(e2, "season"), "eu")
    assert await read_view(redis, hour, True) == [("u2", 3)]


async def test_an_event_stored_without_its_periods_goes_into_the_board_s_periods(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """An event stored before the log kept its periods (NULL) is replayed into the periods the
    board's definition gives it, as before."""
    board = Board(board_id="per", periods=("daily", "weekly", "alltime"))
    await start(redis, keys, db, board)
    now = datetime.now(UTC)
    for i in range(4):
        when = (now - timedelta(seconds=i)).isoformat()
        await write(redis, keys, settings, board, **eu(f"e{i}", f"u{i % 2}", i + 1, when))
    await relay(redis, keys, db, board)
    async with db.begin() as conn:
        await conn.execute(update(score_events).values(periods=None))

    await rebuilt_equals_live(redis, keys, settings, db)
