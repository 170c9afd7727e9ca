"""Bracket notifications of the global scope (docs/api.md section 9): judged on the merged board."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from redis.asyncio import Redis

from services.aggregator.global_brackets import Standing, judge
from shared.brackets import Crossing
from shared.keys import Keys
from shared.ranking import member, tie_key
from shared.settings import LadderSettings
from tests.api.test_reads import at, merge, post
from tests.helpers import api_client

BRACKETS = (1, 10, 100)


# Every entry reached at the same moment: the tie key in front of each user id.
TIE = tie_key(1_700_000_000_000)


def standing(*users: str, scores: dict[str, float] | None = None) -> Standing:
    scores = scores or {}
    return Standing.of([(member(TIE, u), scores.get(u, 100.0 - i)) for i, u in enumerate(users)])


def test_a_written_user_entering_a_top_names_the_smallest_bracket() -> None:
    before = standing("a", "b", "c")
    after = standing("c", "a", "b", scores={"c": 200.0, "a": 100.0, "b": 99.0})
    crossings = judge(before, after, {}, BRACKETS)
    assert crossings == [
        Crossing("c", "entered_top", 1, 1, 3),
        Crossing("a", "overtaken", 1, 2, 1),
    ]


def test_a_user_from_below_the_largest_bracket_has_no_previous_rank() -> None:
    before = standing(*(f"u{i}" for i in range(100)))
    rows = [(member(TIE, "new"), 1000.0)] + [(member(TIE, f"u{i}"), 100.0 - i) for i in range(99)]
    after = Standing.of(rows)
    fallen = {"u99": (101, (1.0, member(TIE, "u99")))}
    crossings = judge(before, after, fallen, BRACKETS)
    assert Crossing("new", "entered_top", 1, 1, None) in crossings
    # Everyone shifted down one: u0 left the top 1, u9 the top 10, u99 the top 100.
    assert Crossing("u0", "overtaken", 1, 2, 1) in crossings
    assert Crossing("u9", "overtaken", 10, 11, 10) in crossings
    assert Crossing("u99", "overtaken", 100, 101, 100) in crossings
    assert len(crossings) == 4


def test_nobody_is_told_of_what_did_not_cross_or_of_their_own_fall() -> None:
    before = standing("a", "b", scores={"a": 50.0, "b": 40.0})
    # `a` was written but still leads; nobody crossed anything.
    assert judge(before, standing("a", "b", scores={"a": 60.0, "b": 40.0}), {}, BRACKETS) == []
    # On a `set` board `a` lowered its own score: `a` was not overtaken, and `b`, moved up by
    # that fall though the merge did not write it, entered the top 1.
    after = standing("b", "a", scores={"b": 40.0, "a": 30.0})
    assert judge(before, after, {}, BRACKETS) == [Crossing("b", "entered_top", 1, 1, 2)]


def test_a_fall_tells_each_user_it_moved_up_into_a_bracket_from_wherever_it_was() -> None:
    # `top` fell from 1st to 150th: everyone moved up one, and `u99`, below the top 100 read
    # before the merge (the largest bracket), came in from outside every bracket.
    before = Standing.of(
        [(member(TIE, "top"), 1000.0)] + [(member(TIE, f"u{i}"), 100.0 - i) for i in range(99)]
    )
    after = Standing.of([(member(TIE, f"u{i}"), 100.0 - i) for i in range(100)])
    fallen = {"top": (150, (-1.0, member(TIE, "top")))}
    assert judge(before, after, fallen, BRACKETS) == [
        Crossing("u0", "entered_top", 1, 1, 2),
        Crossing("u9", "entered_top", 10, 10, 11),
        Crossing("u99", "entered_top", 100, 100, None),
    ]


@asynccontextmanager
async def _listening(redis: Redis, keys: Keys, *users: str) -> AsyncIterator[Any]:
    """A Pub/Sub connection subscribed to the users' channels, closed on the way out."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(*(keys.user_channel(u) for u in users))
    try:
        yield pubsub
    finally:
        await pubsub.aclose()


async def _messages(pubsub: Any, quiet_for: float = 0.5) -> list[dict[str, Any]]:
    """Everything published until the channels have been quiet for ``quiet_for`` seconds."""
    out: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + quiet_for
    while loop.time() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if message is not None:
            out.append(orjson.loads(message["data"]))
            deadline = loop.time() + quiet_for
    return out


async def test_a_merge_tells_who_entered_and_who_was_overtaken_on_the_global_scope(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with _listening(redis, keys, "u-a", "u-b") as pubsub, api_client(quiet) as client:
        await post(client, user_id="u-a", region="eu", value=10, occurred_at=at(1))
        await merge(redis, keys)
        first = await _messages(pubsub)
        await post(client, user_id="u-b", region="us", value=20, occurred_at=at(2))
        await merge(redis, keys)
        second = await _messages(pubsub)
        await post(client, user_id="u-b", region="us", value=5, occurred_at=at(3))
        await merge(redis, keys)
        third = await _messages(pubsub)

    def alltime(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (m["user_id"], m["reason"], m["top"], m["rank"], m["previous_rank"], m["score"])
            for m in messages
            if m["period"] == "alltime"
        ]

    print(f"FIGURES global brackets: messages={len(first)}/{len(second)}/{len(third)}")
    assert {m["scope"] for m in first + second} == {"global"}
    assert {m["type"] for m in first + second} == {"rank"}
    assert {m["period"] for m in first} == {"daily", "weekly", "monthly", "alltime"}
    assert alltime(first) == [("u-a", "entered_top", 1, 1, None, 10)]
    assert sorted(alltime(second)) == [
        ("u-a", "overtaken", 1, 2, 1, 10),
        ("u-b", "entered_top", 1, 1, None, 20),
    ]
    assert third == []


async def test_a_merge_tells_whom_a_fall_moved_into_a_top_on_the_global_scope(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with _listening(redis, keys, "u-a", "u-b") as pubsub, api_client(quiet) as client:
        await post(client, user_id="u-a", region="eu", value=100, occurred_at=at(1))
        await post(client, user_id="u-b", region="us", value=50, occurred_at=at(2))
        await merge(redis, keys)
        await _messages(pubsub)
        # main is an `incr` board taking negative increments: u-a falls below u-b.
        await post(client, user_id="u-a", region="eu", value=-90, occurred_at=at(3))
        await merge(redis, keys)
        fall = await _messages(pubsub)

    fields = ("user_id", "reason", "top", "rank", "previous_rank", "score", "scope")
    assert sorted((m["period"], *(m[f] for f in fields)) for m in fall) == sorted(
        (period, "u-b", "entered_top", 1, 1, 2, 50, "global")
        for period in ("daily", "weekly", "monthly", "alltime")
    )
