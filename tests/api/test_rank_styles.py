"""Rank styles (docs/api.md section 5): ``ordinal``, ``competition`` and ``dense`` on every read
that answers ranks: pages (across page boundaries, with cursors), the standing read, the teams and
friends scopes. The API runs in-process against real Redis with an unreachable broker, so that
nothing but the requests changes the cache."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from services.api.reads.styles import walk_ranks
from shared.boards import Board
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import SERVER, api_client

LEADERBOARD = "/v1/boards/main/leaderboard"
STYLES = ("ordinal", "competition", "dense")


def at(second: int) -> str:
    """A time ``second`` seconds into the last two minutes: later seconds reach a score later,
    so they rank lower among equal scores (all-time ticks are one second)."""
    moment = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=120 - second)
    return moment.isoformat().replace("+00:00", "Z")


async def seed(client: httpx.AsyncClient, scores: list[int], region: str = "eu") -> list[str]:
    """User u-<i> scores ``scores[i]``, each a second after the one before; the user ids."""
    users = []
    for i, value in enumerate(scores):
        user = f"u-{i}"
        body = {"user_id": user, "region": region, "value": value, "occurred_at": at(i)}
        response = await client.post("/v1/boards/main/scores", json=body, headers=SERVER)
        assert response.status_code == 200, response.text
        users.append(user)
    return users


async def get_ok(client: httpx.AsyncClient, path: str, **params: Any) -> dict[str, Any]:
    query = {k: v for k, v in params.items() if v is not None}
    response = await client.get(path, params=query, headers=SERVER)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def all_pages(client: httpx.AsyncClient, limit: int, **params: Any) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = params | {"limit": limit} | ({"cursor": cursor} if cursor else {})
        pages.append(await get_ok(client, LEADERBOARD, **query))
        cursor = pages[-1]["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 50, "the cursor does not end"


def test_walking_a_page_keeps_ties_and_skips_or_not() -> None:
    signed = [40, 40, 30, 30, 30, 20]
    # The first entry sits at position 4, behind three better entries, one of them a 40.
    assert walk_ranks("ordinal", signed, 4, 999) == [4, 5, 6, 7, 8, 9]
    assert walk_ranks("competition", signed, 4, 3) == [3, 3, 6, 6, 6, 9]
    assert walk_ranks("dense", signed, 4, 2) == [2, 2, 3, 3, 3, 4]
    assert walk_ranks("dense", [], 1, 1) == []


async def test_ties_share_a_rank_in_the_competition_and_dense_styles(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        await seed(client, [50, 40, 40, 30])
        pages = {
            style: await get_ok(client, LEADERBOARD, scope="region:eu", rank_style=style)
            for style in (*STYLES, None)
        }

    expected = {"ordinal": [1, 2, 3, 4], "competition": [1, 2, 2, 4], "dense": [1, 2, 2, 3]}
    for style, ranks in expected.items():
        entries = pages[style]["entries"]
        assert [e["rank"] for e in entries] == ranks, style
        assert [e["score"] for e in entries] == [50, 40, 40, 30]
        # u-1 reached 40 first, so it comes before u-2 whatever the style.
        assert [e["user_id"] for e in entries] == ["u-0", "u-1", "u-2", "u-3"]
        assert pages[style]["total"] == 4
    assert pages[None]["entries"] == pages["ordinal"]["entries"]


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_styled_ranks_carry_across_pages(quiet: LadderSettings, limit: int) -> None:
    scores = [50, 40, 40, 40, 30, 30, 20, 20, 20, 10]
    async with api_client(quiet) as client:
        await seed(client, scores)
        read = {
            style: await all_pages(client, limit, scope="region:eu", rank_style=style)
            for style in STYLES
        }

    expected = {
        "ordinal": list(range(1, 11)),
        "competition": [1, 2, 2, 2, 5, 5, 7, 7, 7, 10],
        "dense": [1, 2, 2, 2, 3, 3, 4, 4, 4, 5],
    }
    for style, ranks in expected.items():
        pages = read[style]
        assert [len(p["entries"]) for p in pages] == [
            min(limit, 10 - i) for i in range(0, 10, limit)
        ]
        entries = [e for p in pages for e in p["entries"]]
        assert [e["rank"] for e in entries] == ranks, style
        assert [e["score"] for e in entries] == scores
        assert [e["user_id"] for e in entries] == [f"u-{i}" for i in range(10)]


async def test_an_ascending_board_ranks_the_lowest_first_in_every_style(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    board = Board(board_id="golf", order="asc", operator="best")
    await redis.hset(keys.boards, "golf", board.model_dump_json())
    async with api_client(quiet) as client:
        for i, value in enumerate([72, 68, 68, 75]):
            body = {"user_id": f"g-{i}", "region": "eu", "value": value, "occurred_at": at(i)}
            response = await client.post("/v1/boards/golf/scores", json=body, headers=SERVER)
            assert response.status_code == 200, response.text
        read = {
            style: await get_ok(
                client, "/v1/boards/golf/leaderboard", scope="region:eu", rank_style=style
            )
            for style in STYLES
        }
        standing = await get_ok(
            client, "/v1/boards/golf/users/g-0", scope="region:eu", rank_style="competition"
        )

    for style, ranks in {
        "ordinal": [1, 2, 3, 4],
        "competition": [1, 1, 3, 4],
        "dense": [1, 1, 2, 3],
    }.items():
        order = [("g-1", 68), ("g-2", 68), ("g-0", 72), ("g-3", 75)]
        assert [(e["user_id"], e["score"], e["rank"]) for e in read[style]["entries"]] == [
            (user, score, rank) for (user, score), rank in zip(order, ranks, strict=True)
        ], style
    assert (standing["rank"], standing["score"]) == (3, 72)


async def test_the_standing_read_answers_in_the_style(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        await seed(client, [50, 40, 40, 40, 30])
        read = {
            style: await get_ok(
                client, "/v1/boards/main/users/u-3", scope="region:eu", around=2, rank_style=style
            )
            for style in STYLES
        }

    expected = {
        "ordinal": (4, [2, 3, 4, 5]),
        "competition": (2, [2, 2, 2, 5]),
        "dense": (2, [2, 2, 2, 3]),
    }
    for style, (rank, around) in expected.items():
        body = read[style]
        assert (body["user_id"], body["rank"], body["score"], body["total"]) == (
            "u-3",
            rank,
            40,
            5,
        ), style
        assert [e["user_id"] for e in body["around"]] == ["u-1", "u-2", "u-3", "u-4"]
        assert [e["rank"] for e in body["around"]] == around, style
        # The percentile is of the position, whatever the style: 2 of 5 at or below u-3.
        assert body["percentile"] == pytest.approx(40.0)
