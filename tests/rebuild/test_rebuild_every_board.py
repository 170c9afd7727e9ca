"""``make rebuild`` of every board: a board that cannot be rebuilt (an event Redis applied that
history never stored, as one left in a ``.dead`` queue) is left as it was and named, and holds
back none of the boards after it, which Redis may have lost too (docs/operations.md, "A lost
Redis")."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.rebuild.main import summary
from services.rebuild.rebuilder import Rebuilder, RebuildFailed
from shared.boards import Board, BoardCatalog
from shared.db_boards import save_board
from shared.keys import Keys
from shared.ranking import id_of
from shared.settings import LadderSettings
from tests.rebuild.test_rebuild import eu, relay, write


async def test_a_board_that_cannot_be_rebuilt_holds_back_no_other(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Boards a, b and c (and main): a's newest event never reached MySQL (history refused
    it); b and c lost their regional views. The rebuild rebuilds b and c, leaves a as it was,
    and fails naming a."""
    now = datetime.now(UTC).isoformat()
    for board_id in ("a", "b", "c"):
        board = Board(board_id=board_id, periods=("alltime",))
        await save_board(db, board)
        await BoardCatalog(redis, keys).put(board)
        await write(redis, keys, settings, board, **eu("e1", "u1", 5, now))
        await write(redis, keys, settings, board, **eu("e2", "u2", 6, now))
        await relay(redis, keys, db, board, skip="e2" if board_id == "a" else "")
    views = {b: keys.region_view(b, "alltime", "all", "eu") for b in ("a", "b", "c")}
    await redis.delete(views["b"], views["c"])

    with pytest.raises(RebuildFailed, match=r"^1 of 4 boards not rebuilt: board 'a'") as failed:
        await Rebuilder(db, redis, keys, settings, wait_seconds=1).run()

    # Board main, which every history database holds, is rebuilt too.
    assert [board.board_id for board in failed.value.done] == ["b", "c", "main"]
    assert all(summary(board).startswith(board.board_id) for board in failed.value.done)
    for board_id in ("a", "b", "c"):
        ranked = [id_of(m) for m in await redis.zrevrange(views[board_id], 0, -1)]
        assert ranked == ["u2", "u1"], board_id
