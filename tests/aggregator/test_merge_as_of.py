"""What the global view's ``as_of`` claims (docs/api.md section 5): the time its batch of marks
was taken, so that a score marked after it, which waits for the next batch, is never claimed
merged; a batch this merger did not see taken claims nothing."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

from redis.asyncio import Redis

from bench.probes import layout_entries
from services.aggregator.merge import Merger, Pass
from shared.boards import Board
from shared.keys import Keys, dirty_member

BOARD = Board(board_id="asof", periods=("alltime",))
FIELD = "alltime:all"


async def mark(redis: Redis, keys: Keys, users: list[str], into: str | None = None) -> None:
    """Users with an entry in region eu, marked dirty (or into the set ``into``)."""
    view = keys.region_view(BOARD.board_id, "alltime", "all", "eu")
    mapping, records = layout_entries(random.Random(3), users)
    await redis.zadd(view, mapping)
    await redis.hset(Keys.ties(view), mapping=records)
    marks = [dirty_member("alltime", "all", "eu", u) for u in users]
    await redis.sadd(into or keys.dirty(BOARD.board_id), *marks)


async def test_as_of_is_when_the_batch_was_taken_not_when_it_drained(
    redis: Redis, keys: Keys
) -> None:
    called, marked = [], []

    class Slow(Merger):
        """A merge whose calls take a while, and a score marked while they run."""

        async def _merge_round(
            self, work: Pass, marks_set: str, marks: list[str], depth: int = 2
        ) -> None:
            called.append(datetime.now(UTC))
            await asyncio.sleep(0.5)
            marked.append(datetime.now(UTC))
            await mark(redis, keys, ["late"])
            await super()._merge_round(work, marks_set, marks, depth)

    await mark(redis, keys, ["u-1", "u-2"])
    # as_of is written to the millisecond, cut short: the start of this one.
    before = datetime.now(UTC)
    before = before.replace(microsecond=before.microsecond // 1000 * 1000)
    await Slow(redis, keys).merge_board(BOARD)
    as_of = datetime.fromisoformat(str(await redis.hget(keys.as_of(BOARD.board_id), FIELD)))
    # Taken in this merge, before its calls ran, and so before "late" was marked: not claimed.
    assert len(called) == len(marked) == 1
    assert before <= as_of <= called[0] < marked[0], (before, as_of, called, marked)
    late = dirty_member("alltime", "all", "eu", "late")
    assert await redis.sismember(keys.dirty(BOARD.board_id), late)


async def test_a_batch_left_by_another_merger_moves_no_as_of(redis: Redis, keys: Keys) -> None:
    # A merging set with no take counted by this merger (its holder died): merged, not dated.
    await mark(redis, keys, ["u-1"], into=keys.dirty_merging(BOARD.board_id))
    merger = Merger(redis, keys)
    assert await merger.merge_board(BOARD) == 1
    assert await redis.hget(keys.as_of(BOARD.board_id), FIELD) is None
    # The next batch, taken here, dates it.
    await mark(redis, keys, ["u-2"])
    assert await merger.merge_board(BOARD) == 1
    assert await redis.hget(keys.as_of(BOARD.board_id), FIELD) is not None
