"""``make rebuild`` where event ids are shared across users (an id belongs to its board and
user): the rebuilt board equals the live one, and the rebuild names each event by its id and
user where it waits for MySQL and where it tells the journal's events MySQL holds from those it
must replay."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from services.api.eraser import Eraser
from services.history.handlers import HistoryHandler
from services.rebuild.event_log import held
from services.rebuild.rebuilder import BoardRebuild, Rebuilder
from shared.boards import Board, BoardCatalog
from shared.db import board_deletions, count_events, to_db_time
from shared.db_boards import save_board
from shared.erasure import BoardDeletion, finish_board_deletion
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import read_view
from tests.rebuild.test_rebuild import BOARDS, eu, outbox_events, projection, relay, write

MAIN = BOARDS[0]


def shared_id_scores(count: int, seed: int) -> list[dict[str, Any]]:
    """Scores whose ids each serve three users (``s-<n>`` for u0, u1 and u2 in turn), in a few
    regions and teams."""
    rng = random.Random(seed)
    base = datetime.now(UTC) - timedelta(seconds=30)
    return [
        {
            "event_id": f"s-{i // 3}",
            "user_id": f"u{i % 3}",
            "region": rng.choice(("eu", "na")),
            "value": rng.randint(-5, 50),
            "team_id": rng.choice(("red", "blue", None)),
            "occurred_at": (base + timedelta(milliseconds=i * 250)).isoformat(),
        }
        for i in range(count)
    ]


async def test_a_rebuild_with_ids_shared_across_users_equals_the_live_board(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    await save_board(db, MAIN)
    await BoardCatalog(redis, keys).put(MAIN)
    for body in shared_id_scores(60, seed=7):
        await write(redis, keys, settings, MAIN, **body)
    await relay(redis, keys, db, MAIN)
    before = await projection(redis, settings)
    assert await count_events(db, "main") == 60
    assert await count_events(db, "main", "s-0") == 3
    await redis.delete(keys.feed("main"), keys.region_view("main", "alltime", "all", "eu"))

    [done] = await Rebuilder(db, redis, keys, settings, wait_seconds=5).run(["main"])

    after = await projection(redis, settings)
    assert (done.events, done.refused, done.attempts) == (60, 0, 1)
    assert after == before


async def test_an_event_in_the_outbox_is_waited_for_by_its_user_and_id(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """u2's event ``w`` waits in the outbox (on its way to history) while MySQL holds u1's event
    of the same id: the rebuild waits for u2's own row before it reads MySQL, so it reads it
    once and counts it."""
    base = datetime.now(UTC).isoformat()
    await write(redis, keys, settings, MAIN, **eu("w", "u1", 5, base))
    await relay(redis, keys, db, MAIN)
    await write(redis, keys, settings, MAIN, **eu("w", "u2", 7, base))
    on_its_way: list[ScoreAccepted] = await outbox_events(redis, keys, MAIN)
    await relay(redis, keys, db, MAIN, skip="w")
    before = await projection(redis, settings)

    task = asyncio.create_task(Rebuilder(db, redis, keys, settings, wait_seconds=10).board(MAIN))
    await asyncio.sleep(1.0)
    assert not task.done(), "the rebuild went on without u2's event in MySQL"
    await HistoryHandler(db)(on_its_way)
    done: BoardRebuild = await task

    assert done.attempts == 1 and done.events == 2
    assert await projection(redis, settings) == before


async def test_a_journaled_event_sharing_a_stored_id_is_replayed(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Written while MySQL is read, u2's event ``j`` is in the journal, not in the snapshot;
    MySQL holds u1's event ``j``. The finish replays u2's (MySQL does not hold it) and skips
    none that it should apply: both count once."""
    base = datetime.now(UTC).isoformat()
    for i in range(4):
        await write(redis, keys, settings, MAIN, **eu(f"e{i}", f"u{i % 2}", 10, base))
    await write(redis, keys, settings, MAIN, **eu("j", "u1", 100, base))
    await relay(redis, keys, db, MAIN)
    original_replay = Rebuilder._replay

    async def replay_then_write(self: Rebuilder, *args: Any) -> int:
        refused = await original_replay(self, *args)
        if not await redis.exists(keys.idempotency("main", "j", "u2")):
            await write(redis, keys, settings, MAIN, **eu("j", "u2", 1000, base))
            await relay(redis, keys, db, MAIN)
        return refused

    monkeypatch.setattr(Rebuilder, "_replay", replay_then_write)
    done = await Rebuilder(db, redis, keys, settings, wait_seconds=5).board(MAIN)

    assert (done.events, done.journal_known, done.journal_replayed) == (5, 0, 1)
    view = keys.region_view("main", "alltime", "all", "eu")
    assert dict(await read_view(redis, view, True)) == {"u0": 20, "u1": 120, "u2": 1000}
    assert await redis.get(keys.event_count("main", "alltime", "all")) == "6"


async def test_a_rebuild_across_the_upgrade_waits_for_events_of_the_layout_before(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Just after the upgrade: the newest event key holds a bare id, as the write of the layout
    before noted it, and that event's record, under its id alone, still waits for the
    aggregator's derive step. The rebuild finds the bare id in MySQL (any user's) and waits for
    the derive in the old record."""
    base = datetime.now(UTC).isoformat()
    await write(redis, keys, settings, MAIN, **eu("old", "u1", 5, base))
    await relay(redis, keys, db, MAIN)
    before = await projection(redis, settings)
    record = await redis.get(keys.idempotency("main", "old", "u1"))
    assert record is not None
    await redis.delete(keys.idempotency("main", "old", "u1"))
    legacy = keys.legacy_idempotency("main", "old")
    await redis.set(legacy, "D" + record[1:], ex=60)  # derive pending
    await redis.set(keys.newest_event("main"), "old")

    task = asyncio.create_task(Rebuilder(db, redis, keys, settings, wait_seconds=10).board(MAIN))
    await asyncio.sleep(1.0)
    assert not task.done(), "the rebuild went on before the old record was derived"
    await redis.setbit(legacy, 5, 0)  # the aggregator's derive step
    done: BoardRebuild = await task

    assert done.attempts == 1 and done.events == 1
    after = await projection(redis, settings)
    # The newest event key is the write's, left as the test set it; every other key as it was.
    newest = keys.newest_event("main")
    assert after.pop(newest)[1] == b"old" and before.pop(newest)[1] == b"old:u1"
    assert after == before


async def deleted_and_made_again(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine, board: Board
) -> None:
    """``board`` with u1's event ``w`` stored, then deleted without purge (the deletion done:
    its keys gone, its events kept under its epoch) and made again under its name."""
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)
    await write(redis, keys, settings, board, **eu("w", "u1", 5, datetime.now(UTC).isoformat()))
    await relay(redis, keys, db, board)
    deletion = BoardDeletion(board.board_id, datetime.now(UTC), False, None)
    async with db.begin() as conn:
        await conn.execute(
            insert(board_deletions).values(
                board_id=board.board_id, cutoff=to_db_time(deletion.cutoff), purge=False
            )
        )
    await Eraser(db, redis, keys, BoardCatalog(redis, keys), 0).delete_boards([deletion])
    await finish_board_deletion(db, deletion)
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)


async def test_a_deleted_boards_event_of_the_same_id_is_not_taken_for_the_new_ones(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """A board deleted without purge keeps u1's event ``w`` in MySQL; the board made again
    under its name accepts u1's own ``w``, another event, which waits in the outbox (on its way
    to history). The rebuild waits for that event's row, not the deleted board's, before it
    reads MySQL: it reads it once, in one attempt."""
    board = Board(board_id="again", periods=("alltime",))
    await deleted_and_made_again(redis, keys, settings, db, board)
    await write(redis, keys, settings, board, **eu("w", "u1", 7, datetime.now(UTC).isoformat()))
    on_its_way: list[ScoreAccepted] = await outbox_events(redis, keys, board)
    await relay(redis, keys, db, board, skip="w")
    before = await projection(redis, settings)
    async with db.connect() as conn:
        assert await held(conn, "again", {"w:u1"}) == set()

    task = asyncio.create_task(Rebuilder(db, redis, keys, settings, wait_seconds=10).board(board))
    await asyncio.sleep(1.0)
    assert not task.done(), "the rebuild went on without the new board's event in MySQL"
    await HistoryHandler(db)(on_its_way)
    done: BoardRebuild = await task

    assert done.attempts == 1 and done.events == 1
    assert await projection(redis, settings) == before
    view = keys.region_view("again", "alltime", "all", "eu")
    assert dict(await read_view(redis, view, True)) == {"u1": 7}
