"""Dense ranks of the global scope on demand (docs/api.md section 5, docs/architecture.md "Dense
ranks on demand"): the merge keeps no distinct-score set for a global view until a dense read
asks; that read is answered exactly by a walk, marks the board and the view, and the
aggregator's build makes the set, which the merge then keeps. Past the walk's bound a dense read
is a 503 with Retry-After until the set is built. The API runs in-process against real Redis with
an unreachable broker; the test runs the aggregator's steps itself."""

from __future__ import annotations

from typing import Any

import httpx
from redis.asyncio import Redis

from services.aggregator.merge import Merger
from shared.boards import MAIN_BOARD, Board, BoardCatalog
from shared.keys import Keys
from shared.ranking import member, record, tie_key
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, assert_problem, get_ok
from tests.api.test_reads import at, merge, post
from tests.helpers import SERVER, api_client

GLOBAL = {"scope": "global", "period": "alltime"}
# eu and na: u-1 and u-2 tie on the global sum (40), u-3 and u-4 on 30.
SCORES = [("u-0", "eu", 50), ("u-1", "eu", 40), ("u-2", "na", 40), ("u-3", "na", 30)]
SCORES += [("u-4", "eu", 20), ("u-4", "na", 10), ("u-5", "na", 5)]
DENSE = {"u-0": 1, "u-1": 2, "u-2": 2, "u-3": 3, "u-4": 3, "u-5": 4}


async def dense_answers(client: httpx.AsyncClient) -> dict[str, Any]:
    """Every way to read a dense global rank: the page, each user's standing and ranks."""
    page = await get_ok(client, LEADERBOARD, **GLOBAL, rank_style="dense", limit=3)
    second = await get_ok(
        client, LEADERBOARD, **GLOBAL, rank_style="dense", cursor=page["next_cursor"]
    )
    out: dict[str, Any] = {
        "page": {e["user_id"]: e["rank"] for e in page["entries"] + second["entries"]}
    }
    out["standing"] = {}
    out["ranks"] = {}
    for user in DENSE:
        body = await get_ok(client, f"/v1/boards/main/users/{user}", **GLOBAL, rank_style="dense")
        out["standing"][user] = body["rank"]
        ranks = await get_ok(client, f"/v1/boards/main/users/{user}/ranks", rank_style="dense")
        out["ranks"][user] = ranks["periods"]["alltime"]["scopes"]["global"]["rank"]
    return out


async def test_dense_global_reads_before_and_after_the_build(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    view = keys.global_view("main", "alltime", "all")
    async with api_client(quiet) as client:
        for i, (user, region, value) in enumerate(SCORES):
            await post(client, user_id=user, region=region, value=value, occurred_at=at(i))
        await merge(redis, keys)
        # Never read densely: the merge kept no distinct-score set.
        assert not await redis.exists(Keys.distinct(view), keys.dense("main"))
        # Competition and ordinal reads do not ask for one.
        await get_ok(client, LEADERBOARD, **GLOBAL, rank_style="competition")
        assert not await redis.exists(keys.dense("main"), keys.dense_build("main"))

        # Before the build: exact, walked, and the board and the view marked.
        before = await dense_answers(client)
        assert before == {"page": DENSE, "standing": DENSE, "ranks": DENSE}
        # (The ranks read counts the user's dense rank in its regions too: read densely.)
        assert await redis.smembers(keys.dense("main")) == {"global", "region"}
        assert "alltime|all|global" in await redis.smembers(keys.dense_build("main"))
        assert not await redis.exists(Keys.distinct(view))

        # A merge while the set is wanted keeps the one being built; the build finishes it.
        await post(client, user_id="u-5", region="eu", value=45, occurred_at=at(20))
        await merge(redis, keys)
        assert await Merger(redis, keys).build_dense(MAIN_BOARD) >= 1
        assert not await redis.exists(Keys.distinct_building(view))
        assert "alltime|all|global" not in await redis.smembers(keys.dense_build("main"))
        # u-5: 50 in all, tying u-0.
        want = {**DENSE, "u-5": 1}
        assert await redis.zrange(Keys.distinct(view), 0, -1) == ["30", "40", "50"]
        assert await dense_answers(client) == {"page": want, "standing": want, "ranks": want}

        # After it: the merge keeps the set; the reads count on it.
        await post(client, user_id="u-6", region="eu", value=35, occurred_at=at(30))
        await merge(redis, keys)
        assert await redis.zrange(Keys.distinct(view), 0, -1) == ["30", "35", "40", "50"]
        body = await get_ok(client, "/v1/boards/main/users/u-3", **GLOBAL, rank_style="dense")
        assert body["rank"] == 4


async def test_a_dense_global_read_too_deep_to_walk_waits_for_the_build(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """1,200 distinct global scores, written as the merge writes them: a dense read of the last
    one would walk past the bound: 503 with Retry-After, the view marked; built, it answers."""
    view = keys.global_view("main", "alltime", "all")
    users = {f"g{i}": 10_000 - i for i in range(1200)}
    await redis.zadd(view, {member(tie_key(1_700_000_000_000), u): s for u, s in users.items()})
    await redis.hset(
        Keys.ties(view),
        mapping={u: record(tie_key(1_700_000_000_000), s) for u, s in users.items()},
    )
    async with api_client(quiet) as client:
        path = "/v1/boards/main/users/g1199"
        response = await client.get(path, params={**GLOBAL, "rank_style": "dense"}, headers=SERVER)
        assert_problem(response, 503)
        assert "alltime|all|global" in await redis.smembers(keys.dense_build("main"))
        # The top of the board is near enough to walk.
        top = await get_ok(client, "/v1/boards/main/users/g10", **GLOBAL, rank_style="dense")
        assert top["rank"] == 11
        merger = Merger(redis, keys)
        merger.build_step = 100  # several steps
        assert await merger.build_dense(MAIN_BOARD) == 1
        assert await redis.zcard(Keys.distinct(view)) == 1200
        body = await get_ok(client, path, **GLOBAL, rank_style="dense")
        assert body["rank"] == 1200


async def test_builds_of_two_boards_partway_at_once_each_go_on_from_their_own_cursor(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Two boards' all-time global views, each too deep to walk, built a step a pass and the
    passes taking turns: each build goes on from where its own board's stopped (both views are
    named alike in their boards' build sets), so every distinct score of each is in its set."""
    other = Board(board_id="arena")
    await BoardCatalog(redis, keys).put(other)
    tops = {"main": 10_000, "arena": 5_000}
    for bid, top in tops.items():
        view = keys.global_view(bid, "alltime", "all")
        users = {f"g{i}": top - i for i in range(1200)}
        tie = tie_key(1_700_000_000_000)
        await redis.zadd(view, {member(tie, u): s for u, s in users.items()})
        await redis.hset(Keys.ties(view), mapping={u: record(tie, s) for u, s in users.items()})
    async with api_client(quiet) as client:
        for bid in tops:
            path = f"/v1/boards/{bid}/users/g1199"
            response = await client.get(path, params={**GLOBAL, "rank_style": "dense"})
            assert_problem(response, 503)
        merger = Merger(redis, keys)
        merger.build_step = 100
        built = {"main": 0, "arena": 0}
        for _ in range(40):
            for board in (MAIN_BOARD, other):
                built[board.board_id] += await merger.build_dense(board, budget=0)
        assert built == {"main": 1, "arena": 1}
        for bid in tops:
            view = keys.global_view(bid, "alltime", "all")
            assert await redis.zcard(Keys.distinct(view)) == 1200
            body = await get_ok(
                client, f"/v1/boards/{bid}/users/g1199", **GLOBAL, rank_style="dense"
            )
            assert body["rank"] == 1200
