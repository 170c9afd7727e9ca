"""Dense ranks of a region scope on demand (docs/api.md section 5, docs/architecture.md "Dense
ranks on demand"): the write keeps no distinct-score set for a regional view; a dense read is
answered exactly by a walk and marks the board ("region") and the view; past the walk's bound it
is a 503 with Retry-After until the aggregator has built the set, which its derive step then
keeps. The API runs in-process against real Redis with an unreachable broker; the test runs the
aggregator's steps itself."""

from __future__ import annotations

from typing import Any

import httpx
from redis.asyncio import Redis

from services.aggregator.merge import Merger
from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.ranking import member, record, tie_key
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, assert_problem, get_ok
from tests.api.test_reads import FEED_LENGTH, at, post
from tests.helpers import SERVER, api_client, derive_outbox

EU = {"scope": "region:eu", "period": "alltime"}
# incr: u-1 and u-2 tie on 40 in eu (u-2 in two events), u-3 and u-4 on 30.
SCORES = [("u-0", 50), ("u-1", 40), ("u-2", 25), ("u-2", 15), ("u-3", 30), ("u-4", 30)]
SCORES += [("u-5", 5)]
DENSE = {"u-0": 1, "u-1": 2, "u-2": 2, "u-3": 3, "u-4": 3, "u-5": 4}


async def dense_answers(client: httpx.AsyncClient) -> dict[str, Any]:
    """Every way to read a dense rank in eu: the page, each user's standing and ranks."""
    page = await get_ok(client, LEADERBOARD, **EU, rank_style="dense", limit=3)
    second = await get_ok(client, LEADERBOARD, **EU, rank_style="dense", cursor=page["next_cursor"])
    out: dict[str, Any] = {
        "page": {e["user_id"]: e["rank"] for e in page["entries"] + second["entries"]},
        "standing": {},
        "ranks": {},
    }
    for user in DENSE:
        body = await get_ok(client, f"/v1/boards/main/users/{user}", **EU, rank_style="dense")
        out["standing"][user] = body["rank"]
        ranks = await get_ok(client, f"/v1/boards/main/users/{user}/ranks", rank_style="dense")
        out["ranks"][user] = ranks["periods"]["alltime"]["scopes"]["region:eu"]["rank"]
    return out


async def test_dense_region_reads_before_and_after_the_build(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    view = keys.region_view("main", "alltime", "all", "eu")
    async with api_client(quiet) as client:
        for i, (user, value) in enumerate(SCORES):
            await post(client, user_id=user, region="eu", value=value, occurred_at=at(i))
        await derive_outbox(redis, keys, MAIN_BOARD, FEED_LENGTH)
        # Never read densely: neither the write nor the derive step kept a distinct-score set.
        assert not await redis.exists(Keys.distinct(view), keys.dense("main"))
        await get_ok(client, LEADERBOARD, **EU, rank_style="competition")
        assert not await redis.exists(keys.dense("main"), keys.dense_build("main"))

        # Before the build: exact, walked, and the board and the view marked.
        assert await dense_answers(client) == {"page": DENSE, "standing": DENSE, "ranks": DENSE}
        assert "region" in await redis.smembers(keys.dense("main"))
        assert "alltime|all|region:eu" in await redis.smembers(keys.dense_build("main"))
        assert not await redis.exists(Keys.distinct(view))

        # A write before the build, derived after it: the set follows it all the same.
        await post(client, user_id="u-5", region="eu", value=45, occurred_at=at(20))
        assert await Merger(redis, keys).build_dense(MAIN_BOARD) >= 1
        assert "alltime|all|region:eu" not in await redis.smembers(keys.dense_build("main"))
        await derive_outbox(redis, keys, MAIN_BOARD, FEED_LENGTH)
        # u-5: 50, tying u-0; 5 nobody holds any more.
        want = {**DENSE, "u-5": 1}
        assert await redis.zrange(Keys.distinct(view), 0, -1) == ["30", "40", "50"]
        assert await dense_answers(client) == {"page": want, "standing": want, "ranks": want}

        # After it: the derive step keeps the set; the reads count on it.
        # u-2 leaves 40 to u-1 alone, then u-1 leaves it for 50.
        await post(client, user_id="u-6", region="eu", value=35, occurred_at=at(30))
        await post(client, user_id="u-2", region="eu", value=5, occurred_at=at(31))
        await post(client, user_id="u-1", region="eu", value=10, occurred_at=at(32))
        await derive_outbox(redis, keys, MAIN_BOARD, FEED_LENGTH)
        assert await redis.zrange(Keys.distinct(view), 0, -1) == ["30", "35", "45", "50"]
        body = await get_ok(client, "/v1/boards/main/users/u-3", **EU, rank_style="dense")
        assert body["rank"] == 4


async def test_a_dense_region_read_too_deep_to_walk_waits_for_the_build(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """1,200 distinct scores in eu, laid out as the write lays them out: a dense read of the
    last would walk past the bound: 503 with Retry-After, the view marked; built, it answers."""
    view = keys.region_view("main", "alltime", "all", "eu")
    users = {f"g{i}": 10_000 - i for i in range(1200)}
    tie = tie_key(1_700_000_000_000)
    await redis.zadd(view, {member(tie, u): s for u, s in users.items()})
    await redis.hset(Keys.ties(view), mapping={u: record(tie, s) for u, s in users.items()})
    async with api_client(quiet) as client:
        path = "/v1/boards/main/users/g1199"
        response = await client.get(path, params={**EU, "rank_style": "dense"}, headers=SERVER)
        assert_problem(response, 503)
        assert response.headers["retry-after"] == "2"
        assert "alltime|all|region:eu" in await redis.smembers(keys.dense_build("main"))
        top = await get_ok(client, "/v1/boards/main/users/g10", **EU, rank_style="dense")
        assert top["rank"] == 11
        merger = Merger(redis, keys)
        merger.build_step = 100
        assert await merger.build_dense(MAIN_BOARD) == 1
        assert await redis.zcard(Keys.distinct(view)) == 1200
        body = await get_ok(client, path, **EU, rank_style="dense")
        assert body["rank"] == 1200
