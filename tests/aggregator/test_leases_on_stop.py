"""An aggregator that stops cleanly gives up the leases it holds (shared/lease.py): the merge
lease of a board whose backlog its last pass left partway, and the live lease of a board whose
live views it computes. Another aggregator, or this one restarted under a new owner name, then
takes the boards over at its next tick, not three merge intervals later. A lease given up is
only ever this process's own: one that lapsed and went to another stays the other's."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from services.aggregator import main as aggregator_main
from services.aggregator.live_tracker import LiveViews
from services.aggregator.main import tick
from services.aggregator.merge import ROUND, Merger
from shared.boards import MAIN_BOARD, Board
from shared.keys import Keys
from shared.lease import Lease
from tests.aggregator.test_live_views import recorder
from tests.aggregator.test_merge_lease import BOARD, write
from tests.helpers import made

# Longer than the test: a lease that is gone was given up, it did not lapse.
TTL = 60.0


class Catalog:
    """The board of the merge (a backlog) and board main (hot events)."""

    async def all(self) -> list[Board]:
        return [BOARD, MAIN_BOARD]


async def test_a_stopped_aggregator_gives_its_merge_and_live_leases_up(
    redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pass merges one round at most: the backlog outlasts the aggregator's last pass.
    monkeypatch.setattr(aggregator_main, "MERGE_BUDGET", 0.0)
    await write(redis, keys, 0, 3 * ROUND, seed=7)
    await recorder(redis, keys)([made("u-1", 5, datetime.now(UTC))])
    merger = Merger(redis, keys, Lease(redis, keys, ttl=TTL, owner="one"))
    live = LiveViews(redis, keys, Lease(redis, keys, ttl=TTL, owner="one", kind="live"))
    stop = asyncio.Event()
    stop.set()  # one pass each, the last on the way out
    await tick(merger, live, Catalog(), 0.05, stop)  # type: ignore[arg-type]

    # The last pass held both: the board's merge is left partway, its hot view computed.
    assert await redis.scard(keys.dirty_merging(BOARD.board_id)) > 0
    assert await redis.get(keys.hot_view("main", 60)) is not None
    # Both given up on the way out.
    assert not await redis.exists(keys.merge_lease(BOARD.board_id))
    assert not await redis.exists(keys.lease("main", "live"))

    # The restarted aggregator (a new owner name) takes both boards over at its first tick.
    again = Merger(redis, keys, Lease(redis, keys, ttl=TTL, owner="two"))
    assert await again.merge_board(BOARD, None) > 0
    assert not await redis.exists(keys.dirty_merging(BOARD.board_id))
    live_again = LiveViews(redis, keys, Lease(redis, keys, ttl=TTL, owner="two", kind="live"))
    await recorder(redis, keys)([made("u-2", 5, datetime.now(UTC))])
    assert await live_again.lease.hold("main")


async def test_a_lease_that_went_to_another_is_not_given_up(redis: Redis, keys: Keys) -> None:
    from shared.lease import give_up

    one = Lease(redis, keys, ttl=TTL, owner="one", kind="live")
    two = Lease(redis, keys, ttl=TTL, owner="two", kind="live")
    assert await one.hold("main") and await one.hold("other")
    await redis.delete(keys.lease("main", "live"))  # "one" paused past its lease on main
    assert await two.hold("main")
    await give_up(one)
    # "one"'s own lease is gone; the one "two" holds now stays.
    assert not await redis.exists(keys.lease("other", "live"))
    assert await redis.get(keys.lease("main", "live")) == f"{two.token('main')}"
    assert await one.release_all() == 0  # nothing left to give up
