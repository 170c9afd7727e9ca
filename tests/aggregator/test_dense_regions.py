"""The regional views' distinct-score sets on demand (docs/architecture.md, "Dense ranks on
demand"): the write keeps none; once a dense read asks for one, the aggregator builds it from the
view, and its derive step keeps it exact from the pairs each event's outbox result names (the
entry's new pair, and the one it held before), whatever the order of its batches, on
redelivery, and while the build is under way. Checked against Python's count of the distinct
(score, subscore) pairs the view holds."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from services.aggregator.merge import Merger
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board, BoardCatalog
from shared.events import ScoreAccepted
from shared.functions import PLACE_FUNCTION
from shared.keys import Keys
from shared.ranking import MAX_SCORE, sub_of
from shared.settings import LadderSettings
from tests.helpers import derive

FEED = 10
# A set board (scores go down as well as up, so pairs are left behind), with a subscore; and a
# best board without one.
SET_BOARD = Board(
    board_id="dr-set",
    operator="set",
    order="asc",
    subscore_order="desc",
    periods=("daily", "alltime"),
)
BEST_BOARD = Board(board_id="dr-best", operator="best", periods=("daily", "alltime"))


async def held_pairs(redis: Redis, view: str) -> list[str]:
    """The distinct-score set the view should have: one member a distinct pair its entries hold
    (the subscore part, then the signed score), in the set's order."""
    rows: list[Any] = await redis.zrange(view, 0, -1, withscores=True)
    pairs = {(int(score), sub_of(member)) for member, score in rows}
    return [f"{sub}{score}" for score, sub in sorted(pairs)]


async def write(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    board: Board,
    rng: random.Random,
    count: int,
    start: int,
) -> list[ScoreAccepted]:
    """``count`` scores of eight users in regions eu and na, from a few values and subscores so
    that pairs tie and are left; the events as the outbox has them, in acceptance order."""
    bid = board.board_id
    before = await redis.xlen(keys.outbox(bid))
    now = datetime.now(UTC) - timedelta(seconds=30)
    for i in range(start, start + count):
        score = ScoreIn(
            user_id=f"u{rng.randrange(8)}",
            region=rng.choice(("eu", "eu", "na")),
            value=rng.randrange(1, 7),
            subscore=rng.randrange(3) if board.subscore_order else None,
            occurred_at=now + timedelta(milliseconds=i),
        )
        await submit(redis, keys, settings, board, score, f"{bid}-{i}")
    entries: list[Any] = await redis.xrange(keys.outbox(bid))
    return [ScoreAccepted.model_validate_json(f["e"]) for _, f in entries[before:]]


async def test_a_board_never_read_densely_keeps_no_regional_distinct_set(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Writes and their derive step, improvements and pairs left included: no regional view
    has a distinct-score set, nor one being built."""
    await BoardCatalog(redis, keys).put(SET_BOARD)
    events = await write(redis, keys, settings, SET_BOARD, random.Random(7), 40, 0)
    await derive(redis, keys, SET_BOARD, events, FEED)
    found = [k async for k in redis.scan_iter(match=keys.tag(SET_BOARD.board_id) + ":*")]
    assert any(":region:eu" in k for k in found)
    assert not [k for k in found if ":region:" in k and ":distinct" in k]
    # What the derive step keeps a set by: each changed period's pair before, in the entry.
    changed = [r for e in events for r in e.periods.values() if r.improved]
    before = [r for r in changed if r.previous_score is not None]
    assert before and all(r.previous_subscore is not None for r in before)
    assert not [
        r
        for e in events
        for r in e.periods.values()
        if not r.improved and r.previous_score is not None
    ]


@pytest.mark.parametrize("board", [SET_BOARD, BEST_BOARD], ids=["set-subscore", "best"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_built_then_kept_exact_by_the_derive_step_in_any_order(
    settings: LadderSettings, redis: Redis, keys: Keys, board: Board, seed: int
) -> None:
    """A dense read asked for eu's all-time set (the marker and the build set, as the API
    writes them); the build runs a step at a time while writes go on and their batches are
    derived late, out of order and some twice; at every point the set, once made, holds no pair
    the view does not and, once every batch is derived, exactly the view's pairs."""
    rng = random.Random(seed)
    bid = board.board_id
    await BoardCatalog(redis, keys).put(board)
    view = keys.region_view(bid, "alltime", "all", "eu")
    done: list[list[ScoreAccepted]] = [await write(redis, keys, settings, board, rng, 30, 0)]
    await derive(redis, keys, board, done[0], FEED)
    assert not await redis.exists(Keys.distinct(view))

    await redis.sadd(keys.dense(bid), "region")
    await redis.sadd(keys.dense_build(bid), "alltime|all|region:eu")
    merger = Merger(redis, keys)
    merger.build_step = 2
    waiting: list[list[ScoreAccepted]] = []
    for round_ in range(12):
        waiting.append(await write(redis, keys, settings, board, rng, 6, 100 + 10 * round_))
        await merger.build_dense(board, 0)  # one step
        # Derive some of the waiting batches, in any order; redeliver an old one now and then.
        rng.shuffle(waiting)
        for _ in range(rng.randrange(len(waiting) + 1)):
            batch = waiting.pop()
            await derive(redis, keys, board, batch, FEED)
            done.append(batch)
        if rng.random() < 0.5:
            await derive(redis, keys, board, rng.choice(done), FEED)
    await merger.build_dense(board)
    assert "alltime|all|region:eu" not in await redis.smembers(keys.dense_build(bid))
    for batch in waiting:
        await derive(redis, keys, board, batch, FEED)
    # A redelivery of everything changes nothing.
    for batch in done:
        await derive(redis, keys, board, batch, FEED)
    assert await redis.zrange(Keys.distinct(view), 0, -1) == await held_pairs(redis, view)
    assert await redis.ttl(Keys.distinct(view)) == -1  # all-time: never expires
    # Only the view that was asked for has one.
    other = keys.region_view(bid, "alltime", "all", "na")
    daily = keys.region_view(bid, "daily", done[0][0].periods["daily"].period_id, "eu")
    assert not await redis.exists(Keys.distinct(other), Keys.distinct(daily))

    # From then on, writes and their derive step keep it exact.
    more = await write(redis, keys, settings, board, rng, 40, 1000)
    await derive(redis, keys, board, more[20:], FEED)
    await derive(redis, keys, board, more[:20], FEED)
    assert await redis.zrange(Keys.distinct(view), 0, -1) == await held_pairs(redis, view)
    assert not await redis.exists(Keys.distinct_building(view))


async def test_a_build_whose_set_went_starts_again_from_the_top(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A build's cursor goes on only with the set it was building: if that set went meanwhile
    (a rebuild drops it, with the view it followed), the build starts from the top, and the set
    it ends with is whole."""
    board = BEST_BOARD
    bid = board.board_id
    await BoardCatalog(redis, keys).put(board)
    view = keys.region_view(bid, "alltime", "all", "eu")
    events = await write(redis, keys, settings, board, random.Random(5), 40, 0)
    await derive(redis, keys, board, events, FEED)
    await redis.sadd(keys.dense_build(bid), "alltime|all|region:eu")
    merger = Merger(redis, keys)
    merger.build_step = 1
    await merger.build_dense(board, 0)
    await merger.build_dense(board, 0)
    assert await redis.zcard(Keys.distinct_building(view)) == 2
    await redis.delete(Keys.distinct_building(view))
    await merger.build_dense(board)
    assert await redis.zrange(Keys.distinct(view), 0, -1) == await held_pairs(redis, view)


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_the_entry_before_is_named_exactly_at_the_ends_of_the_range(
    settings: LadderSettings, redis: Redis, keys: Keys, order: str
) -> None:
    """``previous_score`` and ``previous_subscore`` of the outbox entry, which the write reads
    back from the entry's record (its subscore part holds 2**54 - 1 values, more than a double
    holds exactly): exact at the ends of the range and around zero, in both subscore orders."""
    board = Board(
        board_id=f"dr-ends-{order}",
        operator="set",
        subscore_order=order,
        periods=("alltime",),
        min_value=-MAX_SCORE,
        max_value=MAX_SCORE,
    )
    await BoardCatalog(redis, keys).put(board)
    now = datetime.now(UTC) - timedelta(seconds=10)
    edges = [-MAX_SCORE, -MAX_SCORE + 1, -(2**52) - 1, -1, 0, 1, 2**52 + 1, MAX_SCORE - 1]
    edges.append(MAX_SCORE)
    for i, sub in enumerate(edges):
        user = f"e{i}"
        for j, value in enumerate((MAX_SCORE - i, -MAX_SCORE + i)):
            score = ScoreIn(
                user_id=user,
                region="eu",
                value=value,
                subscore=sub,
                occurred_at=now + timedelta(milliseconds=2 * i + j),
            )
            await submit(redis, keys, settings, board, score, f"ends-{order}-{i}-{j}")
    entries: list[Any] = await redis.xrange(keys.outbox(board.board_id))
    events = [ScoreAccepted.model_validate_json(f["e"]) for _, f in entries]
    seconds = [e.periods["alltime"] for e in events[1::2]]
    assert [(r.previous_score, r.previous_subscore) for r in seconds] == [
        (MAX_SCORE - i, sub) for i, sub in enumerate(edges)
    ]
    assert all(r.improved and r.score == -MAX_SCORE + i for i, r in enumerate(seconds))
    assert all(e.periods["alltime"].previous_score is None for e in events[0::2])


async def test_a_dense_count_of_a_pair_not_derived_yet_counts_the_pairs_above(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A regional set trails the writes by the derive step: a read of an entry whose pair the
    set does not hold yet counts the pairs above it all the same (on a board with a subscore,
    where the count is the pair's place in the set)."""
    board, bid = SET_BOARD, SET_BOARD.board_id  # ascending: 1 beats 3; subscore: 2 beats 0
    await BoardCatalog(redis, keys).put(board)
    view = keys.region_view(bid, "alltime", "all", "eu")
    now = datetime.now(UTC) - timedelta(seconds=10)

    async def put(i: int, user: str, value: int, sub: int) -> None:
        at = now + timedelta(milliseconds=i)
        body = ScoreIn(user_id=user, region="eu", value=value, subscore=sub, occurred_at=at)
        await submit(redis, keys, settings, board, body, f"nd-{i}")

    await put(0, "a", 1, 2)
    await put(1, "b", 1, 0)
    await put(2, "c", 3, 1)
    await redis.sadd(keys.dense_build(bid), "alltime|all|region:eu")
    await Merger(redis, keys).build_dense(board)
    await put(3, "d", 1, 1)  # (1, 1): between a's and b's pairs, not derived yet

    async def dense_count(user: str) -> int:
        found: list[Any] = await redis.fcall_ro(
            PLACE_FUNCTION,
            4,
            view,
            Keys.ties(view),
            keys.names(bid),
            Keys.distinct(view),
            user,
            0,
            "dense",
        )
        return int(found[6])

    assert [await dense_count(u) for u in "adbc"] == [0, 1, 1, 2]
    entries: list[Any] = await redis.xrange(keys.outbox(bid))
    await derive(
        redis, keys, board, [ScoreAccepted.model_validate_json(f["e"]) for _, f in entries], FEED
    )
    assert [await dense_count(u) for u in "adbc"] == [0, 1, 2, 3]
