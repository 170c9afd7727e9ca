"""Subscores (the contract's v1.1 in docs/api.md, sections 3, 4 and 5): on a board with a
``subscore_order``, entries rank by score in the board's ``order``, then by subscore in its own
direction, then by who reached that (score, subscore) pair first, to the millisecond; on every
period, in the regions, the merged global view and the friends scope, in every rank style, and
through cursors.

Black-box, as tests/api/test_wide_scores.py: boards made with ``PUT /v1/boards/{id}``, scores
sent and read over HTTP, one merge run by hand where a test reads the global view. The expected
orders come from :func:`ranking`, a plain sort checked against a hand-made order below.
Which write improves, and which is refused: tests/api/test_subscore_writes.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.test_wide_scores import (
    WIDE,
    befriend,
    exact,
    merge_board,
    moment,
    put_board,
    read,
    send,
)
from tests.helpers import api_client

PERIODS = ("daily", "weekly", "monthly", "alltime")
STYLES = ("ordinal", "competition", "dense")
# Every board that may have a subscore: operator, order, subscore order.
KINDS = [
    (operator, order, sub_order)
    for operator in ("best", "set")
    for order in ("desc", "asc")
    for sub_order in ("desc", "asc")
]


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database (boards and friends are
    written to MySQL)."""
    return quiet


@dataclass(frozen=True)
class Write:
    """One score: who, where, the pair, and when (milliseconds after the test's start)."""

    user: str
    region: str
    score: int
    sub: int
    ms: int


def ranking(writes: list[Write], order: str, sub_order: str) -> list[Write]:
    """Entries (one write each) in board order: score, then subscore, then the earlier."""
    sign = -1 if order == "desc" else 1
    sub_sign = -1 if sub_order == "desc" else 1
    return sorted(writes, key=lambda w: (sign * w.score, sub_sign * w.sub, w.ms))


def styled(ranked: list[Write], style: str) -> list[int]:
    """The ranks of entries in board order: equal only where score and subscore are equal."""
    pairs = [(w.score, w.sub) for w in ranked]
    if style == "ordinal":
        return list(range(1, len(pairs) + 1))
    if style == "competition":
        return [pairs.index(p) + 1 for p in pairs]
    distinct = list(dict.fromkeys(pairs))
    return [distinct.index(p) + 1 for p in pairs]


def rows(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """``(rank, user, score, subscore)`` of entries, both numbers checked to be JSON integers."""
    return [(e["rank"], e["user_id"], exact(e["score"]), exact(e["subscore"])) for e in entries]


def expected(ranked: list[Write], style: str) -> list[tuple[Any, ...]]:
    ranks = styled(ranked, style)
    return [(r, w.user, w.score, w.sub) for r, w in zip(ranks, ranked, strict=True)]


async def send_pair(client: httpx.AsyncClient, board: str, w: Write, start: datetime) -> Any:
    at = start + timedelta(milliseconds=w.ms)
    return await send(client, board, w.user, w.score, at, region=w.region, subscore=w.sub)


async def page_of(
    client: httpx.AsyncClient, board: str, scope: str, period: str, period_id: str, **more: Any
) -> list[tuple[Any, ...]]:
    path = f"/v1/boards/{board}/leaderboard"
    body = await read(
        client, path, scope=scope, period=period, period_id=period_id, limit=100, **more
    )
    return rows(body["entries"])


# --- the order: score, subscore, then who reached the pair first -------------------------------

S = 7 * 10**12
# Nine users, one score each, reached 1 ms apart in this order (not their ids'): ties on score
# with every subscore direction, equal pairs in one region and across both, and subscores of
# either sign far beyond the scores' own spacing.
WRITES = [
    Write("w-k", "eu", S, 40, 0),
    Write("w-b", "na", S, -40, 1),
    Write("w-z", "eu", S, 0, 2),
    Write("w-c", "na", S, 0, 3),
    Write("w-a", "eu", S, 0, 4),
    Write("w-m", "na", S + 1, -(10**15), 5),
    Write("w-y", "eu", S - 1, 10**15, 6),
    Write("w-d", "eu", S, 40, 7),
    Write("w-n", "na", S - 1, 10**15, 8),
]
FRIENDS_OF_C = ("w-k", "w-a", "w-n")


def test_the_expected_order_is_score_then_subscore_then_time() -> None:
    ranked = ranking(WRITES, "desc", "desc")
    users = ["w-m", "w-k", "w-d", "w-z", "w-c", "w-a", "w-b", "w-y", "w-n"]
    assert [w.user for w in ranked] == users
    assert styled(ranked, "competition") == [1, 2, 2, 4, 4, 4, 7, 8, 8]
    assert styled(ranked, "dense") == [1, 2, 2, 3, 3, 3, 4, 5, 5]
    golf = ranking(WRITES, "asc", "asc")
    assert [w.user for w in golf][:5] == ["w-y", "w-n", "w-b", "w-z", "w-c"]


def scopes_of(order: str, sub_order: str) -> dict[str, list[Write]]:
    """The members of each scope read, in board order."""
    group = {"w-c", *FRIENDS_OF_C}
    return {
        "region:eu": ranking([w for w in WRITES if w.region == "eu"], order, sub_order),
        "region:na": ranking([w for w in WRITES if w.region == "na"], order, sub_order),
        "global": ranking(WRITES, order, sub_order),
        "friends:w-c": ranking([w for w in WRITES if w.user in group], order, sub_order),
    }


@pytest.mark.parametrize(("operator", "order", "sub_order"), KINDS)
async def test_entries_rank_by_score_then_subscore_then_who_reached_the_pair_first(
    quiet: LadderSettings, redis: Redis, keys: Keys, operator: str, order: str, sub_order: str
) -> None:
    board = f"{operator}-{order}-{sub_order}"
    start = moment()
    async with api_client(quiet) as client:
        await put_board(
            client, board, operator=operator, order=order, subscore_order=sub_order, **WIDE
        )
        await befriend(client, "w-c", *FRIENDS_OF_C)
        answers = [await send_pair(client, board, w, start) for w in WRITES]
        await merge_board(redis, keys, board)
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        seen = {
            (period, scope, style): await page_of(
                client, board, scope, period, ids[period], rank_style=style
            )
            for period in PERIODS
            for scope in scopes_of(order, sub_order)
            for style in STYLES
        }
        standings = {
            (period, w.user): await read(
                client,
                f"/v1/boards/{board}/users/{w.user}",
                scope="global",
                period=period,
                period_id=ids[period],
                around=1,
                rank_style="competition",
            )
            for period in PERIODS
            for w in WRITES
        }

    scopes = scopes_of(order, sub_order)
    want = {
        (period, scope, style): expected(members, style)
        for period in PERIODS
        for scope, members in scopes.items()
        for style in STYLES
    }
    assert seen == want
    merged = scopes["global"]
    competition = styled(merged, "competition")
    for (_, user), body in standings.items():
        at = [w.user for w in merged].index(user)
        assert (body["rank"], exact(body["score"]), exact(body["subscore"])) == (
            competition[at],
            merged[at].score,
            merged[at].sub,
        )
        assert rows(body["around"]) == expected(merged, "competition")[max(at - 1, 0) : at + 2]
    # Each write's rank in its region, read in its atomic step, is the order's at that moment.
    for i, (w, answer) in enumerate(zip(WRITES, answers, strict=True)):
        so_far = ranking([x for x in WRITES[: i + 1] if x.region == w.region], order, sub_order)
        rank = [x.user for x in so_far].index(w.user) + 1
        for period in PERIODS:
            assert answer["periods"][period]["rank"] == rank, (w.user, period)


# A user's regions merged: on best the best pair (the earliest reached of equal ones), on set the
# latest write. Who writes where: user, region, score steps better than 100, subscore steps
# better than 0, with its metadata.
SPREAD = [
    ("x", "na", 0, 0),
    ("x", "eu", 0, 1),  # the same score, a better subscore, later
    ("y", "na", 0, 1),  # x's best pair, reached after x reached it
    ("z", "eu", -1, 9),
    ("x", "ap", 0, 1),  # x's best pair again, last of all
]
MERGED = {
    "best": [("x", 0, 1, "eu"), ("y", 0, 1, "na"), ("z", -1, 9, "eu")],
    "set": [("y", 0, 1, "na"), ("x", 0, 1, "ap"), ("z", -1, 9, "eu")],
}


@pytest.mark.parametrize(("operator", "order", "sub_order"), KINDS)
async def test_the_global_view_merges_a_users_regions_by_pair(
    quiet: LadderSettings, redis: Redis, keys: Keys, operator: str, order: str, sub_order: str
) -> None:
    board = f"{operator}-{order}-{sub_order}"
    up, sup = (1 if order == "desc" else -1), (1 if sub_order == "desc" else -1)
    start = moment()
    async with api_client(quiet) as client:
        await put_board(client, board, operator=operator, order=order, subscore_order=sub_order)
        answers = [
            await send(
                client, board, user, 100 + off * up, start + timedelta(milliseconds=i),
                region=region, subscore=sub * sup, metadata={"region": region},
            )
            for i, (user, region, off, sub) in enumerate(SPREAD)
        ]  # fmt: skip
        await merge_board(redis, keys, board)
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        seen = {
            (period, style): (
                await read(
                    client,
                    f"/v1/boards/{board}/leaderboard",
                    period=period,
                    period_id=ids[period],
                    rank_style=style,
                )
            )["entries"]
            for period in PERIODS
            for style in ("ordinal", "competition")
        }

    for (period, style), entries in seen.items():
        ranks = [1, 2, 3] if style == "ordinal" else [1, 1, 3]
        assert [
            (e["rank"], e["user_id"], e["score"], e["subscore"], e["metadata"]) for e in entries
        ] == [
            (rank, user, 100 + off * up, sub * sup, {"region": region})
            for rank, (user, off, sub, region) in zip(ranks, MERGED[operator], strict=True)
        ], (period, style)


# --- cursors through equal scores --------------------------------------------------------------


async def walk_rows(
    client: httpx.AsyncClient, board: str, **params: Any
) -> list[list[tuple[Any, ...]]]:
    """Every page of one entry of a view, following ``next_cursor`` to the end."""
    pages: list[list[tuple[Any, ...]]] = []
    cursor = None
    while True:
        query = params | {"limit": 1} | ({"cursor": cursor} if cursor else {})
        body = await read(client, f"/v1/boards/{board}/leaderboard", **query)
        pages.append(rows(body["entries"]))
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 50, "the cursor does not end"


# Twelve users share score 50 with subscores that repeat, reached 1 ms apart in an order that is
# not their ids'; one user is above them, reached last, and two below, reached first.
CROWD = [
    Write("c-low", "eu", 49, 9, 0),
    Write("c-lower", "eu", 49, 9, 1),
    *(
        Write(f"c-{(i * 5) % 12:02d}", "eu", 50, sub, i + 2)
        for i, sub in enumerate([3, 1, 3, 2, 1, 3, 0, 2, 1, 3, 0, 2])
    ),
    Write("c-top", "eu", 51, -5, 14),
]


@pytest.mark.parametrize("sub_order", ["desc", "asc"])
async def test_cursors_page_one_entry_at_a_time_through_equal_scores(
    quiet: LadderSettings, redis: Redis, keys: Keys, sub_order: str
) -> None:
    """Pages of one, through every period, the region, global and a friends scope, in every
    style: each entry once, in order, with its rank."""
    start = moment()
    async with api_client(quiet) as client:
        await put_board(client, "crowd", operator="best", subscore_order=sub_order)
        await befriend(client, "c-00", *(w.user for w in CROWD if w.user != "c-00"))
        answers = [await send_pair(client, "crowd", w, start) for w in CROWD]
        await merge_board(redis, keys, "crowd")
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        walks = {
            (period, scope, style): await walk_rows(
                client, "crowd", scope=scope, period=period, period_id=ids[period], rank_style=style
            )
            for period in PERIODS
            for scope in ("region:eu", "global", "friends:c-00")
            for style in STYLES
        }

    ranked = ranking(CROWD, "desc", sub_order)
    for (period, scope, style), pages in walks.items():
        assert [len(p) for p in pages] == [1] * len(CROWD), (period, scope, style)
        got = [row for p in pages for row in p]
        assert got == expected(ranked, style), (period, scope, style)


# --- the ends of the range ---------------------------------------------------------------------

BIG = 2**53 - 1
EXTREMES = [
    Write("e-1", "eu", BIG, -BIG, 0),
    Write("e-2", "na", BIG, BIG, 1),
    Write("e-3", "eu", 7, BIG - 1, 2),
    Write("e-4", "na", 7, -BIG + 1, 3),
    Write("e-5", "eu", 7, 0, 4),
    Write("e-6", "na", 7, BIG, 5),
    Write("e-7", "eu", -BIG, BIG, 6),
    Write("e-8", "na", -BIG, -BIG, 7),
    Write("e-9", "eu", 7, BIG, 8),
    Write("e-0", "na", 7, -BIG, 9),
]


@pytest.mark.parametrize(("operator", "order", "sub_order"), KINDS)
async def test_the_ends_of_the_range_work_as_subscores(
    quiet: LadderSettings, redis: Redis, keys: Keys, operator: str, order: str, sub_order: str
) -> None:
    """Subscores at ±(2**53 - 1) and one step inside, beside scores at the same ends, read back
    exactly and in order. A subscore is not bounded by the board's ``min_value`` and
    ``max_value`` (those bound the value): board ``near`` keeps the default ±1,000,000."""
    board = f"{operator}-{order}-{sub_order}"
    start = moment()
    near = [Write("n-1", "eu", 5, -BIG, 0), Write("n-2", "eu", 5, BIG, 1)]
    async with api_client(quiet) as client:
        kind = {"operator": operator, "order": order, "subscore_order": sub_order}
        await put_board(client, board, **kind, **WIDE)
        await put_board(client, "near", **kind)
        answers = [await send_pair(client, board, w, start) for w in EXTREMES]
        for w in near:
            await send_pair(client, "near", w, start)
        await merge_board(redis, keys, board)
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        seen = {
            (period, scope, style): await page_of(
                client, board, scope, period, ids[period], rank_style=style
            )
            for period in PERIODS
            for scope in ("region:eu", "region:na", "global")
            for style in ("ordinal", "dense")
        }
        standings = {
            w.user: await read(client, f"/v1/boards/{board}/users/{w.user}", scope="global")
            for w in EXTREMES
        }
        near_page = await page_of(client, "near", "region:eu", "alltime", "all")

    members = {
        "region:eu": [w for w in EXTREMES if w.region == "eu"],
        "region:na": [w for w in EXTREMES if w.region == "na"],
        "global": EXTREMES,
    }
    assert seen == {
        (period, scope, style): expected(ranking(ws, order, sub_order), style)
        for period in PERIODS
        for scope, ws in members.items()
        for style in ("ordinal", "dense")
    }
    ranked = [w.user for w in ranking(EXTREMES, order, sub_order)]
    for w in EXTREMES:
        body = standings[w.user]
        assert (body["rank"], exact(body["score"]), exact(body["subscore"])) == (
            ranked.index(w.user) + 1,
            w.score,
            w.sub,
        )
    assert near_page == expected(ranking(near, order, sub_order), "ordinal")
