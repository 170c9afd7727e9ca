"""``make rebuild RESTORED=1`` after the history database was restored from a backup
(docs/operations.md, "Backing up and restoring MySQL"): MySQL lacks for good the events stored
after the backup was taken, which Redis still holds. The rebuild makes each board what MySQL
holds (those events taken off every view, the global one through the merge), rather than wait
for them forever or refuse the board because its live counters are ahead of MySQL's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncEngine

from services.aggregator.merge import Merger
from services.rebuild import rebuilder
from services.rebuild.rebuilder import Rebuilder, RebuildFailed
from shared.boards import Board, BoardCatalog
from shared.db import score_events
from shared.db_boards import save_board
from shared.keys import Keys, dirty_member
from shared.ranking import id_of
from shared.settings import LadderSettings
from tests.rebuild.test_rebuild import eu, relay, write

BOARD = Board(board_id="main", periods=("alltime",))


async def ranked(redis: Redis, key: str) -> list[str]:
    return [id_of(m) for m in await redis.zrevrange(key, 0, -1)]


async def written_then_lost(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine, later: bool
) -> None:
    """u1 in eu, u2 and u3 in na, written, stored and merged; then MySQL goes back to a backup
    taken after u1's event (u2's and u3's gone from it). ``later``: a write of u4 afterwards,
    stored, so that only the live counters are ahead of MySQL; else the newest event Redis
    applied (u3's) is one MySQL lacks."""
    await save_board(db, BOARD)
    await BoardCatalog(redis, keys).put(BOARD)
    now = datetime.now(UTC).isoformat()
    await write(redis, keys, settings, BOARD, **eu("e1", "u1", 5, now))
    for n, user in ((2, "u2"), (3, "u3")):
        await write(redis, keys, settings, BOARD, **{**eu(f"e{n}", user, 9, now), "region": "na"})
    await relay(redis, keys, db, BOARD)
    marks = [dirty_member("alltime", "all", r, u) for r, u in (("eu", "u1"), ("na", "u2"))]
    await redis.sadd(keys.dirty("main"), *marks, dirty_member("alltime", "all", "na", "u3"))
    await Merger(redis, keys).merge_board(BOARD)
    assert await ranked(redis, keys.global_view("main", "alltime", "all")) == ["u3", "u2", "u1"]
    async with db.begin() as conn:
        await conn.execute(delete(score_events).where(score_events.c.user_id.in_(["u2", "u3"])))
    if later:
        await write(redis, keys, settings, BOARD, **eu("e4", "u4", 1, now))
        await relay(redis, keys, db, BOARD)


@pytest.mark.parametrize("later", [False, True], ids=["newest-lost", "counters-ahead"])
async def test_a_rebuild_after_a_restore_makes_the_board_what_mysql_holds(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine, later: bool
) -> None:
    await written_then_lost(redis, keys, settings, db, later)

    await Rebuilder(db, redis, keys, settings, wait_seconds=1, restored=True).run()

    await Merger(redis, keys).merge_board(BOARD)
    kept = ["u1", "u4"] if later else ["u1"]
    assert await ranked(redis, keys.region_view("main", "alltime", "all", "na")) == []
    assert await ranked(redis, keys.region_view("main", "alltime", "all", "eu")) == kept
    assert await ranked(redis, keys.global_view("main", "alltime", "all")) == kept
    assert await redis.get(keys.event_count("main", "alltime", "all")) == str(len(kept))


async def test_without_restored_such_a_board_is_refused_and_left_as_it_was(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ordinary rebuild takes a live counter ahead of MySQL for history still catching up,
    and gives up (docs/reliability.md): ``--restored`` is what says MySQL is behind for good."""
    await written_then_lost(redis, keys, settings, db, later=True)
    region = keys.region_view("main", "alltime", "all", "na")
    monkeypatch.setattr(rebuilder, "ATTEMPTS", 1)  # each attempt is refused alike

    with pytest.raises(RebuildFailed):
        await Rebuilder(db, redis, keys, settings, wait_seconds=1).run()

    assert await ranked(redis, region) == ["u3", "u2"]
