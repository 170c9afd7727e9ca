"""The merge function (``ladder_merge_v6``, shared/lua/merge.lua) against :func:`combine`, the
reference: random boards, operators, orders, subscores, metadata, scores at the range's ends,
regions missing from a user's listing (its field of the users' regions hash, or its set of the
layout before) or holding no record, and a second merge over the first. The
global distinct-score set: none on a board not read densely; exact on one read densely from the
start, and on one whose set is built (a step at a time, around the second merge) once a dense
read asks for it."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from services.aggregator.combine import Entry, combine
from services.aggregator.merge import Merger
from shared.boards import Board
from shared.keys import REGIONS_SEPARATOR, Keys, dirty_member
from shared.ranking import (
    MAX_SCORE,
    member,
    parse_record,
    record,
    sub_part,
    tie_key,
    written_of,
)
from shared.redis import open_redis
from tests.conftest import ON_CLUSTER

REGIONS = ("eu", "na", "ap", "eu-2")
USERS = ("a", "b", "c", "d", "e")
# Few reach times and scores, so that equal pairs, equal times and equal sums come up often.
scores = st.one_of(
    st.sampled_from([0, 1, -1, 7, MAX_SCORE, -MAX_SCORE, MAX_SCORE - 1]),
    st.integers(-MAX_SCORE, MAX_SCORE),
)
metas = st.sampled_from(["", '{"k":1}', '{"s":"a|b"}'])
# One regional entry: score, reach time (ms), subscore, metadata, and on set boards how long
# after its reach time it was last written (its score set again: None or 0, when reached).
entries = st.tuples(
    scores, st.integers(0, 3), st.integers(-3, 3), metas, st.none() | st.integers(0, 3)
)
# A state of the board: user -> region -> entry (a region left out holds no record).
states = st.dictionaries(
    st.sampled_from(USERS), st.dictionaries(st.sampled_from(REGIONS), entries, max_size=4)
)


@dataclass(frozen=True)
class Listing:
    """Each user's regions as listed (maybe fewer than it played in, or one with no record), and
    the users listed in a set of the layout before rather than in the users' regions hash."""

    regions: dict[str, list[str]]
    legacy: frozenset[str]


listings = st.builds(
    Listing,
    regions=st.dictionaries(
        st.sampled_from(USERS), st.lists(st.sampled_from([*REGIONS, "gone"]), max_size=3)
    ),
    legacy=st.frozensets(st.sampled_from(USERS)),
)


def regional(board: Board, raw: tuple[int, int, int, str, int | None]) -> Entry:
    score, reached, subscore, meta, later = raw
    signed = score if board.descending else -score
    written = reached + later if later and board.operator == "set" else None
    return signed, tie_key(reached, sub_part(subscore, board.subscore_order)), meta, written


async def write_state(redis: Redis, keys: Keys, board: Board, state: dict, listed: Listing) -> None:
    """The regional views as ``state`` says, each user's regions as ``listed`` says, and a mark
    per user and region of the state."""
    bid = board.board_id
    for region in REGIONS:
        view = keys.region_view(bid, "alltime", "all", region)
        await redis.delete(view, Keys.ties(view))
    for user, regions in state.items():
        for region, raw in regions.items():
            signed, tie, meta, written = regional(board, raw)
            view = keys.region_view(bid, "alltime", "all", region)
            await redis.zadd(view, {member(tie, user): signed})
            await redis.hset(Keys.ties(view), user, record(tie, signed, meta, written))
            await redis.sadd(keys.dirty(bid), dirty_member("alltime", "all", region, user))
    for user, regions in listed.regions.items():
        await redis.delete(keys.legacy_user_regions(bid, user))
        await redis.hdel(keys.user_regions(bid), user)
        if regions and user in listed.legacy:
            await redis.sadd(keys.legacy_user_regions(bid, user), *regions)
        elif regions:
            field = REGIONS_SEPARATOR.join(dict.fromkeys(regions))
            await redis.hset(keys.user_regions(bid), user, field)


def expected(board: Board, state: dict) -> dict[str, Entry]:
    """The reference: combine() over each user's entries in sorted region order (a sum out of
    range held at the range's end, whatever the merge before made)."""
    out: dict[str, Entry] = {}
    for user, regions in state.items():
        found = [regional(board, regions[r]) for r in sorted(regions)]
        if found:
            out[user] = combine(board.operator, found)
    return out


def parsed(raw: str) -> Entry:
    tie, signed, meta = parse_record(raw)
    return signed, tie, meta, written_of(raw)


def pairs_of(want: dict[str, Entry]) -> set[str]:
    """The distinct set's members the entries make: subscore part, then signed score."""
    return {f"{tie[:15] if tie.startswith('s') else ''}{s}" for s, tie, *_ in want.values()}


async def check(
    redis: Redis, keys: Keys, board: Board, want: dict[str, Entry], dense: bool
) -> None:
    view = keys.global_view(board.board_id, "alltime", "all")
    records = await redis.hgetall(Keys.ties(view))
    assert {u: parsed(r) for u, r in records.items()} == want
    members = dict(await redis.zrange(view, 0, -1, withscores=True))
    assert members == {member(tie, u): float(s) for u, (s, tie, *_) in want.items()}
    if dense:
        assert set(await redis.zrange(Keys.distinct(view), 0, -1)) == pairs_of(want)
        assert not await redis.exists(Keys.distinct_building(view))
    else:
        assert not await redis.exists(Keys.distinct(view), Keys.distinct_building(view))
    assert not await redis.exists(keys.dirty_merging(board.board_id))


async def ask_dense(redis: Redis, keys: Keys, board: Board) -> None:
    """What a dense read of the global view leaves when its distinct-score set is missing."""
    await redis.sadd(keys.dense(board.board_id), "global")
    await redis.sadd(keys.dense_build(board.board_id), "alltime|all|global")


async def scenario(
    board: Board, first: dict, second: dict, listed: Listing, dense: str, redis_url: str
) -> None:
    """``dense``: "never" read densely, "always" (from before the first merge), or "later"
    (asked after the first merge: built a step before the second merge, the rest after)."""
    prefix = f"lt-mf{uuid.uuid4().hex[:10]}"
    keys = Keys(prefix)
    async with open_redis(redis_url, load_functions=True, cluster=ON_CLUSTER) as redis:
        try:
            merger = Merger(redis, keys)
            merger.build_step = 1
            if dense == "always":
                await ask_dense(redis, keys, board)
            # A user's regions list what ``listed`` says, maybe less than it played in.
            await write_state(redis, keys, board, first, listed)
            await merger.merge_board(board)
            merged_first = expected(board, first)
            await check(redis, keys, board, merged_first, dense == "always")
            if dense == "later":
                await ask_dense(redis, keys, board)
                await merger.build_dense(board, budget=0)  # one step, then the merge
            # Then the regions change: entries move, go, appear; the global view follows.
            await write_state(redis, keys, board, second, listed)
            for user in (u for u in first if not second.get(u)):  # in no region now: marked
                mark = dirty_member("alltime", "all", REGIONS[0], user)
                await redis.sadd(keys.dirty(board.board_id), mark)
            await merger.merge_board(board)
            if dense != "never":
                await merger.build_dense(board)
                assert not await redis.exists(keys.dense_build(board.board_id))
            want = expected(board, second)
            await check(redis, keys, board, want, dense != "never")
        finally:
            found = [k async for k in redis.scan_iter(match="{" + prefix + ":*")]
            if found:
                await redis.delete(*found)


@settings(max_examples=120, deadline=None)
@given(
    operator=st.sampled_from(["incr", "best", "set"]),
    order=st.sampled_from(["desc", "asc"]),
    subscored=st.booleans(),
    first=states,
    second=states,
    listed=listings,
    dense=st.sampled_from(["never", "always", "later"]),
)
def test_the_function_merges_as_combine_does(
    operator: str,
    order: str,
    subscored: bool,
    first: dict,
    second: dict,
    listed: Listing,
    dense: str,
    redis_url: str,
) -> None:
    sub_order = "asc" if subscored and operator != "incr" else None
    board = Board(
        board_id="m",
        operator=operator,  # type: ignore[arg-type]
        order=order,  # type: ignore[arg-type]
        periods=("alltime",),
        subscore_order=sub_order,  # type: ignore[arg-type]
        min_value=-MAX_SCORE,
        max_value=MAX_SCORE,
    )
    asyncio.run(scenario(board, first, second, listed, dense, redis_url))
