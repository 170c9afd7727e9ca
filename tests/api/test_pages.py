"""Reads (docs/api.md section 5): region pages and cursors, standings, the boards list, the global
scope before and after a merge, past periods.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import (
    LEADERBOARD,
    MAIN,
    SERVER,
    assert_problem,
    get_ok,
    period_ids,
    post,
    rfc,
    score,
)
from tests.api.test_audit_reads_model import aggregate
from tests.helpers import api_client

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


async def seed_players(client: httpx.AsyncClient, count: int = 25) -> None:
    """Users u-01 .. u-<count> in eu, user i scoring 10 * i: u-<count> ranks first."""
    for i in range(1, count + 1):
        await post(client, score(user_id=f"u-{i:02d}", value=10 * i, display_name=f"Player {i}"))


async def read_all_pages(
    client: httpx.AsyncClient, limit: int, **params: Any
) -> list[dict[str, Any]]:
    pages = []
    cursor = None
    while True:
        query = params | {"limit": limit} | ({"cursor": cursor} if cursor else {})
        page = await get_ok(client, LEADERBOARD, **query)
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "the cursor does not end"


async def test_a_region_pages_with_a_cursor(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        await seed_players(client)
        pages = await read_all_pages(client, 10, scope="region:eu")

    assert [len(p["entries"]) for p in pages] == [10, 10, 5]
    entries = [e for p in pages for e in p["entries"]]
    assert [e["rank"] for e in entries] == list(range(1, 26))
    assert [e["user_id"] for e in entries] == [f"u-{i:02d}" for i in range(25, 0, -1)]
    assert [e["score"] for e in entries] == [10 * i for i in range(25, 0, -1)]
    assert [e["display_name"] for e in entries] == [f"Player {i}" for i in range(25, 0, -1)]
    for page in pages:
        assert page["board_id"] == "main"
        assert page["scope"] == "region:eu"
        assert (page["period"], page["period_id"]) == ("alltime", "all")
        assert page["total"] == 25
        assert page["as_of"] is not None
    assert all(p["next_cursor"] for p in pages[:-1])
    assert pages[-1]["next_cursor"] is None


async def test_a_cursor_pages_only_the_view_that_handed_it_out(
    quiet: LadderSettings, redis: Redis, keys: Keys, mysql_database: str
) -> None:
    """A cursor names its view: given with another scope, period, board or friends owner it is a
    422, where it paged that view from a point of the other (a teams read gave an empty page of
    a view of two teams); the same view in another rank style goes on from it."""
    async with api_client(quiet) as client:
        await seed_players(client)
        for friend in ("u-02", "u-03", "u-04"):
            put = await client.put(f"/v1/users/u-01/friends/{friend}", headers=SERVER)
            assert put.status_code == 204
        await aggregate(redis, keys, MAIN_BOARD)  # the friends scope ranks on the merged view
        first = await get_ok(client, LEADERBOARD, scope="region:eu", limit=10)
        cursor = first["next_cursor"]
        dense = await get_ok(
            client, LEADERBOARD, scope="region:eu", cursor=cursor, rank_style="dense"
        )
        assert [e["rank"] for e in dense["entries"]] == list(range(11, 21))
        elsewhere = [
            {"scope": "global"},
            {"scope": "region:na"},
            {"scope": "region:eu", "period": "daily"},
            {"scope": "friends:u-01"},
        ]
        for query in elsewhere:
            refused = await client.get(
                LEADERBOARD, params=query | {"cursor": cursor}, headers=SERVER
            )
            body = assert_problem(refused, 422)
            assert body["errors"][0]["loc"] == ["query", "cursor"], query
            assert "another view" in body["errors"][0]["msg"]
        friends = await get_ok(client, LEADERBOARD, scope="friends:u-01", limit=2)
        for scope, status in (("friends:u-01", 200), ("friends:u-02", 422)):
            query = {"scope": scope, "limit": 2, "cursor": friends["next_cursor"]}
            answer = await client.get(LEADERBOARD, params=query, headers=SERVER)
            assert answer.status_code == status, answer.text


@pytest.mark.parametrize("limit", [10, 3, 1])
async def test_pages_over_exact_ties_repeat_and_skip_no_one(
    quiet: LadderSettings, limit: int
) -> None:
    at = datetime.now(UTC) - timedelta(seconds=30)
    async with api_client(quiet) as client:
        for i in range(25):
            await post(client, score(user_id=f"u-{i:02d}", value=100, occurred_at=rfc(at)))
        pages = await read_all_pages(
            client, limit, scope="region:eu", period="daily", period_id=period_ids(at)["daily"]
        )

    entries = [e for p in pages for e in p["entries"]]
    assert [len(p["entries"]) for p in pages][:-1] == [limit] * (len(pages) - 1)
    assert [e["rank"] for e in entries] == list(range(1, 26))
    assert sorted(e["user_id"] for e in entries) == [f"u-{i:02d}" for i in range(25)]
    assert {e["score"] for e in entries} == {100}


async def test_a_standing_shows_its_neighbours_and_percentile(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        await seed_players(client)
        middle = await get_ok(client, "/v1/boards/main/users/u-13", scope="region:eu", around=2)
        top = await get_ok(client, "/v1/boards/main/users/u-25", scope="region:eu", around=2)
        bottom = await get_ok(client, "/v1/boards/main/users/u-01", scope="region:eu", around=2)
        alone = await get_ok(client, "/v1/boards/main/users/u-13", scope="region:eu")

    assert {k: middle[k] for k in ("user_id", "rank", "score", "total")} == {
        "user_id": "u-13",
        "rank": 13,
        "score": 130,
        "total": 25,
    }
    # The share of the board ranked at or below the user: 13 of 25.
    assert middle["percentile"] == pytest.approx(52.0)
    assert middle["around"] == [
        {
            "rank": rank,
            "user_id": f"u-{26 - rank:02d}",
            "score": 10 * (26 - rank),
            "display_name": f"Player {26 - rank}",
            "metadata": None,
        }
        for rank in range(11, 16)
    ]
    assert [e["rank"] for e in top["around"]] == [1, 2, 3]
    assert top["percentile"] == pytest.approx(100.0)
    assert [e["rank"] for e in bottom["around"]] == [23, 24, 25]
    assert bottom["percentile"] == pytest.approx(4.0)
    assert [e["user_id"] for e in alone["around"]] == ["u-13"]


async def test_boards_are_listed_with_every_field(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        listed = await get_ok(client, "/v1/boards")
        one = await get_ok(client, "/v1/boards/main")
        anonymous = await client.get("/v1/boards/main")

    assert listed == {"boards": [MAIN]}
    assert one == MAIN
    assert anonymous.status_code == 200


async def test_the_global_scope_is_empty_until_the_aggregator_merges(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        await post(client, score(value=10))
        default = await client.get(LEADERBOARD)
        before = datetime.now(UTC)
        weekly = await client.get(LEADERBOARD, params={"scope": "global", "period": "weekly"})
        weeks = {period_ids(before)["weekly"], period_ids(datetime.now(UTC))["weekly"]}

    assert default.status_code == 200
    assert default.json() == {
        "board_id": "main",
        "scope": "global",
        "period": "alltime",
        "period_id": "all",
        "period_ends_at": None,
        "total": 0,
        "as_of": None,
        "entries": [],
        "next_cursor": None,
    }
    assert weekly.status_code == 200
    assert weekly.json()["period_id"] in weeks
    assert (weekly.json()["as_of"], weekly.json()["entries"]) == (None, [])


async def test_a_past_period_within_retention_is_readable(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
        response = await client.get(
            LEADERBOARD, params={"scope": "region:eu", "period": "daily", "period_id": yesterday}
        )

    assert response.status_code == 200, response.text
    assert (response.json()["period_id"], response.json()["entries"]) == (yesterday, [])
