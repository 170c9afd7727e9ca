"""A merge backlog drains in bounded passes while the live views keep their cadence: 200,000
dirty users (as after `make up` with a backlog) do not hold a live-view tick back by more than
about one interval, and the global view converges. A region's top-10 push does not wait for the
backlog: it comes from the region's own view, which the write keeps."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from redis.asyncio import Redis

from bench.probes import layout_entries
from services.aggregator.fresh import FreshRegions
from services.aggregator.live_tracker import LiveViews
from services.aggregator.main import tick
from services.aggregator.merge import Merger
from shared.boards import Board
from shared.keys import Keys, dirty_member
from shared.ranking import member, record, tie_key

# Cadences of a second or two: measured alone, not beside another test (make test).
pytestmark = pytest.mark.timing

BACKLOG = 200_000
# LADDER_MERGE_INTERVAL's default is 2 s; 1 s keeps the test short and the bound tighter.
INTERVAL = 1.0


class Catalog:
    """The one board of the test, as the ticker asks for boards."""

    def __init__(self, board: Board) -> None:
        self.board = board

    async def all(self) -> list[Board]:
        return [self.board]


class TimedLive(LiveViews):
    """The live views, noting when each tick of the board starts."""

    starts: list[float]

    async def tick(self, boards: list[Board]) -> int:
        self.starts.append(time.monotonic())
        return await super().tick(boards)


async def fill(redis: Redis, keys: Keys, bid: str) -> None:
    """The backlog, written straight into Redis as the bench's merge probe writes it."""
    rng = random.Random(5)
    for start in range(0, BACKLOG, 10_000):
        async with redis.pipeline(transaction=False) as pipe:
            for offset in range(start, start + 10_000, 1000):
                region = f"r{offset // 1000 % 8}"
                ids = [f"u{i}" for i in range(offset, offset + 1000)]
                mapping, records = layout_entries(rng, ids)
                view = keys.region_view(bid, "alltime", "all", region)
                pipe.zadd(view, mapping)
                pipe.hset(Keys.ties(view), mapping=records)
                marks = [dirty_member("alltime", "all", region, u) for u in ids]
                pipe.sadd(keys.dirty(bid), *marks)
            await pipe.execute()


async def test_a_backlog_drains_while_live_views_keep_their_cadence(
    redis: Redis, keys: Keys
) -> None:
    board = Board(board_id="backlog", periods=("alltime",), notify_top=(1, 10))
    await fill(redis, keys, board.board_id)
    live = TimedLive(redis, keys)
    live.starts = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(
        tick(Merger(redis, keys), live, Catalog(board), INTERVAL, stop)  # type: ignore[arg-type]
    )
    view = keys.global_view(board.board_id, "alltime", "all")
    began = time.monotonic()
    while await redis.zcard(view) < BACKLOG:
        assert time.monotonic() - began < 120, "the backlog did not drain"
        await asyncio.sleep(0.05)
    drained = time.monotonic()
    stop.set()
    await ticker
    assert not await redis.exists(keys.dirty_merging(board.board_id))
    assert await redis.hlen(Keys.ties(view)) == BACKLOG
    # The live views ticked all along, each held back less than one interval past its own
    # (what holds it back: a merge round's calls in Redis, the pass's budget at most; the whole
    # backlog in one pass took seconds).
    during = [t for t in live.starts if t <= drained]
    assert len(during) >= (drained - began) / (2 * INTERVAL) - 1
    gaps = [b - a for a, b in zip(live.starts, live.starts[1:], strict=False)]
    assert max(gaps) < 2 * INTERVAL, gaps


async def test_a_region_top_push_does_not_wait_for_the_backlog(redis: Redis, keys: Keys) -> None:
    board = Board(board_id="backlog", periods=("alltime",), notify_top=(1, 10))
    await fill(redis, keys, board.board_id)
    fresh = FreshRegions()
    stop = asyncio.Event()
    live = TimedLive(redis, keys)
    live.starts = []
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(keys.board_channel(board.board_id, "region:eu", "alltime"))
        ticker = asyncio.create_task(
            tick(Merger(redis, keys), live, Catalog(board), INTERVAL, stop, fresh)  # type: ignore[arg-type]
        )
        await asyncio.sleep(1.0)  # the backlog's passes under way
        # A fresh score tops region eu, as the write leaves it, and its event is consumed.
        view = keys.region_view(board.board_id, "alltime", "all", "eu")
        tie = tie_key(1_800_000_000_000)
        await redis.zadd(view, {member(tie, "fresh"): 10**9})
        await redis.hset(Keys.ties(view), "fresh", record(tie, 10**9))
        fresh.add(board.board_id, "alltime", "all", "eu")
        written = time.monotonic()
        pushed = None
        while pushed is None and time.monotonic() - written < 10:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message and '"fresh"' in message["data"]:
                pushed = time.monotonic()
        merged = await redis.zcard(keys.global_view(board.board_id, "alltime", "all"))
        stop.set()
        await ticker
    assert pushed is not None, "no push of region eu's new top"
    # About one pass of the backlog's (0.25 s budget), not the backlog's seconds.
    assert pushed - written < 2 * INTERVAL
    assert merged < BACKLOG, "the backlog drained first: the test proves nothing"


async def test_a_fresh_score_reaches_the_global_view_before_the_backlog_drains(
    redis: Redis, keys: Keys
) -> None:
    board = Board(board_id="backlog", periods=("alltime",), notify_top=(1, 10))
    bid = board.board_id
    await fill(redis, keys, bid)
    stop = asyncio.Event()
    live = TimedLive(redis, keys)
    live.starts = []
    ticker = asyncio.create_task(
        tick(Merger(redis, keys), live, Catalog(board), INTERVAL, stop)  # type: ignore[arg-type]
    )
    try:
        await asyncio.sleep(1.0)  # the backlog's passes under way, its marks in the merging set
        assert await redis.exists(keys.dirty_merging(bid))
        # A fresh score in region eu, as the write leaves it, marked dirty as its event is
        # consumed: the mark goes to the dirty set, behind the backlog.
        view = keys.region_view(bid, "alltime", "all", "eu")
        tie = tie_key(1_800_000_000_000)
        await redis.zadd(view, {member(tie, "fresh"): 10**9})
        await redis.hset(Keys.ties(view), "fresh", record(tie, 10**9))
        await redis.sadd(keys.dirty(bid), dirty_member("alltime", "all", "eu", "fresh"))
        written = time.monotonic()
        global_view = keys.global_view(bid, "alltime", "all")
        while await redis.hget(Keys.ties(global_view), "fresh") is None:
            assert time.monotonic() - written < 30, "the fresh score never reached the view"
            await asyncio.sleep(0.02)
        merged_after = time.monotonic() - written
        backlog_left = await redis.scard(keys.dirty_merging(bid))
    finally:
        stop.set()
        await ticker
    print(f"fresh score global {merged_after:.2f} s after its mark, {backlog_left} marks left")
    # A pass or two (0.25 s budget each), not the backlog's seconds.
    assert merged_after < 2 * INTERVAL
    assert backlog_left > 0, "the backlog drained first: the test proves nothing"
    assert (
        await redis.sismember(keys.dirty(bid), dirty_member("alltime", "all", "eu", "fresh")) == 0
    )
