"""Nothing of a deleted board stays in a running aggregator: what its passes keep of each board
(the live views' settled boards, MVP passes and live leases; the closer's quiet boards; the
merge's dense builds partway, merge leases and pushes kept for later) is kept for the boards
defined now, so that boards made and deleted all day do not grow the process without bound."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from redis.asyncio import Redis

from services.aggregator import closer as closes
from services.aggregator.closer import Closer
from services.aggregator.fresh import FreshRegions
from services.aggregator.live_tracker import LiveViews
from services.aggregator.main import merges
from services.aggregator.merge import Merger
from services.api.eraser import Eraser
from shared.boards import Board, BoardCatalog
from shared.erasure import BoardDeletion
from shared.keys import Keys
from shared.ranking import member, record, tie_key
from shared.service import every_pass

GONE, KEPT = Board(board_id="gone"), Board(board_id="kept")


class Boards:
    """The catalog as the tickers ask it: every board defined now."""

    def __init__(self, boards: list[Board]) -> None:
        self.boards = boards

    async def all(self) -> list[Board]:
        return self.boards


async def test_an_aggregator_keeps_nothing_of_a_board_once_it_is_deleted(
    redis: Redis, keys: Keys
) -> None:
    catalog = Boards([GONE, KEPT])
    for board in catalog.boards:  # the closer's look for a deletion finds them defined
        await BoardCatalog(redis, keys).put(board)
    live, merger, fresh = LiveViews(redis, keys), Merger(redis, keys), FreshRegions()
    closer = Closer(redis, keys, lateness=600, merge_interval=2, size=10, outbox_max=100)
    # Work of every kind on both boards: their live views computed, their periods looked at
    # until found quiet, a dense build of a view too deep to walk taken a step.
    await live.tick(catalog.boards)
    for board in catalog.boards:
        for _ in range(4):
            await closer.close_board(board)
        view = keys.global_view(board.board_id, "alltime", "all")
        tie = tie_key(1_700_000_000_000)
        users = {f"g{i}": 1000 - i for i in range(300)}
        await redis.zadd(view, {member(tie, u): s for u, s in users.items()})
        await redis.hset(Keys.ties(view), mapping={u: record(tie, s) for u, s in users.items()})
        await redis.sadd(keys.dense_build(board.board_id), "alltime|all|global")
        merger.build_step = 100
        assert await merger.build_dense(board, budget=0) == 0
    fresh.add(GONE.board_id, "alltime", "all", "eu")
    held = [live._settled, live._full_pass_at, live.lease._tokens, closer._quiet]
    held += [merger.lease._tokens, {bid for bid, _ in merger._building}]
    assert [GONE.board_id in kept for kept in held] == [True] * 6 and GONE.board_id in fresh

    # The board deleted: its definition and keys gone (the API's worker), then a pass of each.
    catalog.boards = [KEPT]
    deletion = BoardDeletion(GONE.board_id, datetime.now(UTC), False, None)
    await Eraser(None, redis, keys, BoardCatalog(redis, keys), 0).delete_boards([deletion])  # type: ignore[arg-type]
    stop = asyncio.Event()
    stop.set()  # one last pass each
    await merges(merger, catalog, 0, stop, fresh)  # type: ignore[arg-type]
    await every_pass(catalog, 0, stop, live.tick)  # type: ignore[arg-type]
    running = asyncio.Event()
    closing = asyncio.create_task(closes.tick(closer, catalog, running))  # type: ignore[arg-type]
    await asyncio.sleep(0.2)
    running.set()
    await closing

    held = [live._settled, live._full_pass_at, live.lease._tokens, closer._quiet]
    held += [merger.lease._tokens, {bid for bid, _ in merger._building}]
    assert [GONE.board_id in kept for kept in held] == [False] * 6
    assert GONE.board_id not in fresh
    # The board defined still is looked after as before.
    assert KEPT.board_id in closer._quiet and KEPT.board_id in live._settled
    kept_view = keys.global_view(KEPT.board_id, "alltime", "all")
    assert await redis.zcard(Keys.distinct(kept_view)) == 300  # its build went on, and finished
