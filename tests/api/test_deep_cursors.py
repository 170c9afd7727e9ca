"""Cursors deep into a large group of tied scores (docs/api.md section 5, docs/security.md
"Crafted cursors"): every page costs about what the first does, whether the cursor's entry is
still there, has left, or never was; and the pages list every entry once, in order."""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from services.api.reads.cursors import encode_cursor
from services.api.reads.views import View
from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.ranking import member, reached_ms, record, tie_key
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, get_ok
from tests.helpers import api_client

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

TIED = 100_000
SCORE = 100
SCOPE = "region:eu"
T0 = reached_ms(datetime(2026, 11, 1, tzinfo=UTC))


def user(i: int) -> str:
    return f"u-{i:06d}"


def member_of(i: int) -> str:
    # User i reached the score i ms after user 0: the earlier ranks first among equal scores.
    return member(tie_key(T0 + i), user(i))


async def tie_everyone(redis: Redis, keys: Keys) -> str:
    """``TIED`` users at one score in board main's all-time view of region eu, as the write
    leaves them (the sorted set and its hash of records), written straight into Redis in
    pipelines; the view's key."""
    view = keys.board_view("main", "alltime", "all", SCOPE)
    chunk = 5000
    for start in range(0, TIED, chunk):
        async with redis.pipeline(transaction=False) as pipe:
            rows = range(start, min(start + chunk, TIED))
            pipe.zadd(view, {member_of(i): SCORE for i in rows})
            pipe.hset(
                Keys.ties(view),
                mapping={user(i): record(tie_key(T0 + i), SCORE) for i in rows},
            )
            await pipe.execute()
    assert await redis.zcard(view) == TIED
    return view


async def read(client: httpx.AsyncClient, limit: int, cursor: str | None) -> dict[str, Any]:
    query: dict[str, Any] = {"scope": SCOPE, "limit": limit}
    if cursor is not None:
        query["cursor"] = cursor
    page: dict[str, Any] = await get_ok(client, LEADERBOARD, **query)
    return page


async def timed(client: httpx.AsyncClient, limit: int, cursor: str | None, runs: int) -> float:
    """The median time of ``runs`` reads of one page."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await read(client, limit, cursor)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def test_pages_through_100000_tied_scores_list_everyone_once_in_order(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    await tie_everyone(redis, keys)
    seen: list[str] = []
    ranks: list[int] = []
    cursor: str | None = None
    async with api_client(quiet) as client:
        while True:
            page = await read(client, 1000, cursor)
            assert page["total"] == TIED
            seen += [e["user_id"] for e in page["entries"]]
            ranks += [e["rank"] for e in page["entries"]]
            assert {e["score"] for e in page["entries"]} == {SCORE}
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert len(seen) < TIED, "the cursor does not end"
    assert seen == [user(i) for i in range(TIED)]
    assert ranks == list(range(1, TIED + 1))


@pytest.mark.timing
async def test_a_deep_cursor_answers_as_fast_as_the_first_page(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    view = await tie_everyone(redis, keys)
    read_view = View(MAIN_BOARD, SCOPE, "alltime", "all", view)
    deep = 90_000
    limit, runs = 100, 7
    # A cursor as the API hands it out, its entry still there; one whose entry has left since
    # (the player's score changed: the cursor's member is gone); and one made up, between two
    # members, as a client crafting cursors would.
    held = encode_cursor(read_view, SCORE, member_of(deep - 1))
    left = encode_cursor(read_view, SCORE, member_of(deep - 2))
    made_up = encode_cursor(read_view, SCORE, member_of(deep - 1) + "~")
    await redis.zrem(view, member_of(deep - 2))
    async with api_client(quiet) as client:
        for cursor in (held, left, made_up):
            page = await read(client, limit, cursor)
            expected = [user(i) for i in range(deep, deep + limit)]
            if cursor is not held:
                # The entry that left ranked just above user deep - 1, and the made-up member
                # sorts just above that user's: either way, that user comes next.
                expected = [user(i) for i in range(deep - 1, deep - 1 + limit)]
            assert [e["user_id"] for e in page["entries"]] == expected
            # One entry above it has left: ranks are counted as the view is now.
            assert page["entries"][0]["rank"] == int(expected[0].removeprefix("u-"))
        first = await timed(client, limit, None, runs)
        costs = {
            name: await timed(client, limit, c, runs)
            for name, c in (("held", held), ("left", left), ("made_up", made_up))
        }
    print(
        f"\nFIGURES deep_cursor: first page {first * 1000:.2f} ms; at {deep} of {TIED} tied: "
        + ", ".join(
            f"{name} {cost * 1000:.2f} ms ({cost / first:.2f}x)" for name, cost in costs.items()
        )
    )
    for name, cost in costs.items():
        assert cost <= 3 * first, f"a {name} cursor took {cost / first:.1f} times the first page"
