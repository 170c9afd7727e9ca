"""``make rebuild`` replays a board's events in the order their writes were applied, their
position in the board's outbox stream, whatever order history stored them in: with two relays
(the default two API workers), a batch read later from the outbox may be published, and stored,
before one read earlier. Events stored without a position (before migration 0012) come first,
in the order they were stored."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import HistoryHandler
from services.rebuild import event_log
from services.rebuild.rebuilder import Rebuilder
from shared.boards import Board, BoardCatalog
from shared.db_boards import save_board
from shared.events import ScoreAccepted, ScoreMessage, message_body, with_outbox_id
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import derive
from tests.rebuild.test_rebuild import FEED_LENGTH, eu, projection, write

MAIN = Board(board_id="main")
LEVEL = Board(board_id="level", operator="set", periods=("weekly", "alltime"))


async def published(redis: Redis, keys: Keys, board: Board) -> list[ScoreAccepted]:
    """The board's outbox as the relay publishes it (each event with its ``outbox_id``), in
    outbox order, read as the consumers read it; the outbox emptied."""
    stream = keys.outbox(board.board_id)
    entries = await redis.xrange(stream)
    body = message_body([with_outbox_id(entry_id, fields["e"]) for entry_id, fields in entries])
    await redis.xdel(stream, *[entry_id for entry_id, _ in entries])
    return ScoreMessage.model_validate_json(body).events


async def delivered(
    redis: Redis, keys: Keys, db: AsyncEngine, board: Board, batches: list[list[ScoreAccepted]]
) -> None:
    """What history and the aggregator's derive step do with ``batches``, one message each, in
    the order they are given: the order two relays' messages may reach them in."""
    for batch in filter(None, batches):
        await HistoryHandler(db)(batch)
        await derive(redis, keys, board, batch, FEED_LENGTH)


async def boards(redis: Redis, keys: Keys, db: AsyncEngine, *made: Board) -> None:
    for board in made:
        await save_board(db, board)
        await BoardCatalog(redis, keys).put(board)


async def rebuilt_equal_to_live(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Rebuild every board from MySQL: every key comes back as the writes made it."""
    before = await projection(redis, settings)
    await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()
    after = await projection(redis, settings)
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not differ, f"keys the rebuild made otherwise: {differ}"


def scores(at: str) -> dict[str, list[dict[str, Any]]]:
    """A user writing twice on an ``incr`` board, another name and metadata each time (a second
    user in between), and a user setting two values on a ``set`` board."""
    return {
        "main": [
            eu("m1", "u1", 5, at, display_name="Ana", metadata={"run": 1}),
            eu("m2", "u2", 3, at, display_name="Cy"),
            eu("m3", "u1", 2, at, display_name="Bo", metadata={"run": 2}),
        ],
        "level": [
            eu("l1", "u1", 9, at, display_name="Ana", metadata={"try": 1}),
            eu("l2", "u1", 4, at, display_name="Bo", metadata={"try": 2}),
        ],
    }


async def test_events_stored_in_another_order_than_written_are_replayed_as_written(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each board's later write published (and stored) before the earlier ones, as a second
    relay would: the rebuild still ends on the later write's display name and metadata, and on
    the ``set`` board on its value. Pages of two events, so that the cursor crosses pages."""
    monkeypatch.setattr(event_log, "PAGE", 2)
    await boards(redis, keys, db, MAIN, LEVEL)
    for board in (MAIN, LEVEL):
        for body in scores(datetime.now(UTC).isoformat())[board.board_id]:
            await write(redis, keys, settings, board, **body)
        events = await published(redis, keys, board)
        # The last write's message first, then the earlier ones'.
        await delivered(redis, keys, db, board, [events[-1:], events[:-1]])
    assert await redis.hget(keys.names("main"), "u1") == "Bo"
    assert await redis.hget(keys.names("level"), "u1") == "Bo"

    await rebuilt_equal_to_live(redis, keys, settings, db)


async def test_events_stored_without_a_position_are_replayed_first_in_stored_order(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events stored before the event log kept positions (published with no ``outbox_id``), in
    the order they were written, as one relay stored them: on ``level`` all of them, on
    ``main`` the first two, its last write stored after them with its position. The rebuild
    replays those without a position in id order, before any with one."""
    monkeypatch.setattr(event_log, "PAGE", 2)
    await boards(redis, keys, db, MAIN, LEVEL)
    for board in (MAIN, LEVEL):
        for body in scores(datetime.now(UTC).isoformat())[board.board_id]:
            await write(redis, keys, settings, board, **body)
        events = await published(redis, keys, board)
        kept = 2 if board is MAIN else len(events)
        old = [e.model_copy(update={"outbox_id": None}) for e in events[:kept]]
        await delivered(redis, keys, db, board, [old, events[kept:]])
    assert await redis.hget(keys.names("main"), "u1") == "Bo"

    await rebuilt_equal_to_live(redis, keys, settings, db)
