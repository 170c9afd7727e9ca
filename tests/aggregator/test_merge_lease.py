"""Several aggregators share the boards: a board's merge is done under its merge lease
(shared/lease.py), so two aggregators merging one board while events keep coming
lose and double nothing, a dead owner's board is taken over once its lease runs out, and an
owner that lost its lease writes nothing more."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from bench.probes import layout_entries
from services.aggregator.main import merges
from services.aggregator.merge import IN_FLIGHT, Merger
from shared.boards import Board
from shared.functions import MERGE_TAKE_FUNCTION
from shared.keys import Keys, dirty_member
from shared.lease import Lease

REGIONS = 8
BOARD = Board(board_id="shared", periods=("alltime",))


class Catalog:
    """The one board of the test, as the ticker asks for boards."""

    async def all(self) -> list[Board]:
        return [BOARD]


async def write(redis: Redis, keys: Keys, first: int, count: int, seed: int) -> None:
    """``count`` users from ``u{first}``, each with one regional entry (a region by its number)
    and its dirty mark, as the write and the consumer leave them."""
    rng = random.Random(seed)
    async with redis.pipeline(transaction=False) as pipe:
        for offset in range(first, first + count, 500):
            ids = [f"u{i}" for i in range(offset, min(first + count, offset + 500))]
            region = f"r{offset // 500 % REGIONS}"
            mapping, records = layout_entries(rng, ids)
            view = keys.region_view(BOARD.board_id, "alltime", "all", region)
            pipe.zadd(view, mapping)
            pipe.hset(Keys.ties(view), mapping=records)
            marks = [dirty_member("alltime", "all", region, u) for u in ids]
            pipe.sadd(keys.dirty(BOARD.board_id), *marks)
        await pipe.execute()


async def regional_records(redis: Redis, keys: Keys) -> dict[str, str]:
    records: dict[str, str] = {}
    for r in range(REGIONS):
        view = keys.region_view(BOARD.board_id, "alltime", "all", f"r{r}")
        records.update(await redis.hgetall(Keys.ties(view)))
    return records


def merger(redis: Redis, keys: Keys, ttl: float) -> Merger:
    return Merger(redis, keys, Lease(redis, keys, ttl=ttl))


class Counting(Merger):
    """A merger that counts the users it merged."""

    total = 0

    async def merge_board(self, board: Board, budget: float | None = None) -> int:
        written = await super().merge_board(board, budget)
        self.total += written
        return written


async def test_two_aggregators_merging_one_board_lose_and_double_nothing(
    redis: Redis, keys: Keys
) -> None:
    stop = asyncio.Event()
    first, second = (Counting(redis, keys, Lease(redis, keys, ttl=1.5)) for _ in range(2))
    assert first.lease.owner != second.lease.owner
    catalog = Catalog()
    tickers = [
        asyncio.create_task(merges(m, catalog, 0.05, stop))  # type: ignore[arg-type]
        for m in (first, second)
    ]
    # Events keep coming while both merge: 60 batches of 1,000 users, a few ms apart.
    for batch in range(60):
        await write(redis, keys, batch * 1000, 1000, seed=batch)
        await asyncio.sleep(0.005)
    view = keys.global_view(BOARD.board_id, "alltime", "all")
    began = time.monotonic()
    while await redis.exists(keys.dirty(BOARD.board_id), keys.dirty_merging(BOARD.board_id)):
        assert time.monotonic() - began < 60, "the marks were not all merged"
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.gather(*tickers)
    # Every user merged once, to its regional record (one region each); the lease given up.
    assert await redis.zcard(view) == 60_000
    assert await redis.hgetall(Keys.ties(view)) == await regional_records(redis, keys)
    assert not await redis.exists(keys.merge_lease(BOARD.board_id))
    # Both took part: each pass goes to whichever holds the lease. (A user's marks that two
    # passes saw count in each, so the totals may pass 60,000.)
    assert first.total > 0 and second.total > 0
    assert first.total + second.total >= 60_000


class Paused(Merger):
    """A merger that stops before its second round until ``resume`` is set: an aggregator
    paused (a long GC, a frozen VM) while it holds a board's lease."""

    resume: asyncio.Event
    paused: asyncio.Event
    rounds: int
    first: int  # users the first round merged

    async def _merge_round(self, work, merging, marks, depth=IN_FLIGHT):  # type: ignore[no-untyped-def]
        self.rounds += 1
        if self.rounds == 2:
            self.first = work.written
            self.paused.set()
            await self.resume.wait()
        await super()._merge_round(work, merging, marks, depth)


async def test_a_paused_owner_is_taken_over_and_then_writes_nothing(
    redis: Redis, keys: Keys
) -> None:
    await write(redis, keys, 0, 12_000, seed=1)
    ttl = 0.5
    paused = Paused(redis, keys, Lease(redis, keys, ttl=ttl))
    paused.resume, paused.paused, paused.rounds = asyncio.Event(), asyncio.Event(), 0
    other = merger(redis, keys, ttl)
    # Rounds of about 5,000 marks: the paused owner merges one, then stops holding the lease.
    task = asyncio.create_task(paused.merge_board(BOARD))
    await asyncio.wait_for(paused.paused.wait(), 10)
    assert await other.merge_board(BOARD) == 0, "taken while its owner held it"
    held_since = time.monotonic()
    while await other.merge_board(BOARD) == 0:
        assert time.monotonic() - held_since < 3 * ttl, "the lease never ran out"
        await asyncio.sleep(0.05)
    # Taken over once the lease ran out; the other drained the board.
    assert time.monotonic() - held_since >= ttl / 2
    assert not await redis.exists(keys.dirty_merging(BOARD.board_id))
    view = keys.global_view(BOARD.board_id, "alltime", "all")
    merged = await redis.hgetall(Keys.ties(view))
    assert merged == await regional_records(redis, keys)
    # New events, then the paused owner resumes: its round is refused, it stops.
    await write(redis, keys, 12_000, 1000, seed=2)
    await redis.set(keys.merge_lease(BOARD.board_id), "999|another", px=5000)
    paused.resume.set()
    written = await task
    assert 0 < written == paused.first, "the paused owner went on after losing its lease"
    assert await redis.hgetall(Keys.ties(view)) == merged
    assert await redis.scard(keys.dirty(BOARD.board_id)) == 1000


class LapsingLease(Lease):
    """A lease whose holder is held up past its ttl before its first renewal (a long GC) while
    no other aggregator runs: the renewal takes the lapsed lease again under a new token."""

    async def renew(self, board_id: str) -> None:
        await asyncio.sleep(0.5)
        await super().renew(board_id)


async def test_a_lease_lost_to_no_one_is_given_up_not_left_to_lapse(
    redis: Redis, keys: Keys
) -> None:
    """The pass stops at the new token (its work no longer fenced by the one it began with);
    the lease it took again is given up at once, so that the next pass, of any aggregator, does
    not wait out its ttl."""
    await write(redis, keys, 0, 12_000, seed=4)
    owner = Merger(redis, keys, LapsingLease(redis, keys, ttl=0.2))
    await owner.merge_board(BOARD)
    assert await redis.exists(keys.dirty_merging(BOARD.board_id)), "the pass did not stop"
    assert not await redis.exists(keys.merge_lease(BOARD.board_id))


async def test_the_take_is_refused_without_the_lease(redis: Redis, keys: Keys) -> None:
    await write(redis, keys, 0, 10, seed=3)
    bid = BOARD.board_id
    await redis.set(keys.merge_lease(bid), "7|someone", px=5000)
    lease_keys = [keys.merge_lease(bid), keys.dirty(bid), keys.dirty_merging(bid)]
    lease_keys.append(keys.merge_takes(bid))
    with pytest.raises(ResponseError, match="FENCED"):
        await redis.fcall(MERGE_TAKE_FUNCTION, 4, *lease_keys, "6|someone")
    assert await redis.scard(keys.dirty(bid)) == 10
    assert not await redis.exists(keys.dirty_merging(bid))
    assert not await redis.exists(keys.merge_takes(bid))
    assert await redis.fcall(MERGE_TAKE_FUNCTION, 4, *lease_keys, "7|someone") == [1, 1]
    assert await redis.scard(keys.dirty_merging(bid)) == 10
    # Counted once: a merging set waiting is merged first, as the same batch.
    assert await redis.fcall(MERGE_TAKE_FUNCTION, 4, *lease_keys, "7|someone") == [1, 1]
    assert await redis.get(keys.merge_takes(bid)) == "1"
    # A merger finds the board taken and leaves it alone.
    assert await merger(redis, keys, 1.0).merge_board(BOARD) == 0
    assert await redis.scard(keys.dirty_merging(bid)) == 10
