"""Dense ranks of a global view without its distinct-score set (docs/architecture.md, "Dense
ranks on demand"), at the Redis functions: the reads' walk (``ladder_place_v3``, which answers
``[count]`` while the set is missing, ``[]`` past its bound) and the aggregator's build
(``ladder_dense_build_v2``, a bounded step a call) against the count made in Python, on random
views with and without subscores, ties of scores and of pairs, and every step size."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from shared.functions import DENSE_BUILD_FUNCTION, PLACE_FUNCTION
from shared.keys import Keys
from shared.ranking import MAX_SCORE, member, record, sub_part, tie_key
from shared.redis import open_redis
from tests.conftest import ON_CLUSTER

# A view's entries: id -> (signed score, subscore); few values, so that ties come up often.
views = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.tuples(
        st.sampled_from([0, 1, -1, 5, MAX_SCORE, -MAX_SCORE]),
        st.integers(-2, 2),
    ),
    max_size=25,
)


async def fill(redis: Redis, view: str, entries: dict, order: str | None) -> dict[str, tuple]:
    """The view in the layout of shared/ranking.py; each id's (signed score, subscore part)."""
    pairs: dict[str, tuple[int, str]] = {}
    for i, (user, (signed, subscore)) in enumerate(sorted(entries.items())):
        sub = sub_part(subscore, order)  # type: ignore[arg-type]
        tie = tie_key(1_700_000_000_000 + i, sub)
        await redis.zadd(view, {member(tie, user): signed})
        await redis.hset(Keys.ties(view), user, record(tie, signed))
        pairs[user] = (signed, sub)
    return pairs


async def dense_counts(redis: Redis, view: str, users: list[str]) -> list[object]:
    names = f"{view}:names"
    out = []
    for user in users:
        found = await redis.fcall_ro(  # type: ignore[misc]
            PLACE_FUNCTION, 4, view, Keys.ties(view), names, Keys.distinct(view), user, 0, "dense"
        )
        out.append(found[6])
    return out


async def scenario(entries: dict, subscored: bool, step: int, redis_url: str) -> None:
    prefix = f"lt-db{uuid.uuid4().hex[:10]}"
    view = f"{{{prefix}:b}}:lb:alltime:all:global"
    build = f"{{{prefix}:b}}:dense:build"
    async with open_redis(redis_url, load_functions=True, cluster=ON_CLUSTER) as redis:
        try:
            pairs = await fill(redis, view, entries, "desc" if subscored else None)
            users = sorted(pairs)
            # Python's count: distinct (score, subscore part) pairs strictly above the user's.
            distinct = set(pairs.values())
            want = [sum(1 for p in distinct if p > pairs[u]) for u in users]
            # Before the build: walked, and said so.
            assert await dense_counts(redis, view, users) == [[n] for n in want]
            # The build, a step of ``step`` members a call, until it says it is done.
            await redis.sadd(build, "alltime|all|global")
            # Built under the board's merge lease, held here with token "1|test".
            lease = f"{{{prefix}:b}}:merge:lease"
            await redis.set(lease, "1|test")
            cursor = ["", ""]
            for _ in range(200):
                reply = await redis.fcall(  # type: ignore[misc]
                    DENSE_BUILD_FUNCTION,
                    5,
                    view,
                    Keys.distinct(view),
                    Keys.distinct_building(view),
                    build,
                    lease,
                    0,
                    "alltime|all|global",
                    *cursor,
                    step,
                    "1|test",
                )
                if not reply:
                    break
                cursor = [str(reply[0]), str(reply[1])]
            else:
                raise AssertionError("the build does not end")
            assert not await redis.exists(build, Keys.distinct_building(view))
            built = set(await redis.zrange(Keys.distinct(view), 0, -1))
            assert built == {f"{sub}{signed}" for signed, sub in distinct}
            # After it: counted on the set, as a number.
            assert await dense_counts(redis, view, users) == want
        finally:
            found = [k async for k in redis.scan_iter(match="{" + prefix + ":*")]
            if found:
                await redis.delete(*found)


@settings(max_examples=80, deadline=None)
@given(entries=views, subscored=st.booleans(), step=st.integers(1, 4))
def test_the_walk_and_the_build_count_as_python_does(
    entries: dict, subscored: bool, step: int, redis_url: str
) -> None:
    asyncio.run(scenario(entries, subscored, step, redis_url))


async def test_a_walk_past_its_bound_says_so(redis_url: str) -> None:
    """1,001 distinct scores above the last entry: more than a read walks (``[]``); 1,000 are
    walked."""
    prefix = f"lt-db{uuid.uuid4().hex[:10]}"
    view = f"{{{prefix}:b}}:lb:alltime:all:global"
    async with open_redis(redis_url, load_functions=True, cluster=ON_CLUSTER) as redis:
        try:
            await fill(redis, view, {f"u{i}": (5000 - i, 0) for i in range(1002)}, None)
            counts = await dense_counts(redis, view, ["u1000", "u1001"])
            assert counts == [[1000], []]
        finally:
            found = [k async for k in redis.scan_iter(match="{" + prefix + ":*")]
            if found:
                await redis.delete(*found)
