"""Pages read while the board moves (docs/api.md section 5: "a page never repeats or skips an
entry that did not move").

A board of many users, most of them tied in a few scores, is read page by page with random
limits; between the pages random users score (up, down, onto a tie, off one). The pages, kept
to the users that never moved during the walk, must hold each of them once, in the board's
order, in a region and in a friends scope.
"""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.boards import Board
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import add_board, rfc
from tests.api.test_audit_reads_model import Model, aggregate
from tests.helpers import SERVER, api_client

SEEDS = [int(s) for s in os.environ.get("LADDER_AUDIT_SEEDS", "1,2,3,4").split(",")]
USERS = [f"p{i:02d}" for i in range(30)]


async def score(
    client: httpx.AsyncClient, model: Model, board: str, user: str, value: int, at: int
) -> None:
    body = {
        "user_id": user,
        "region": "eu",
        "value": value,
        "occurred_at": rfc(datetime.fromtimestamp(at / 1000, UTC)),
    }
    response = await client.post(f"/v1/boards/{board}/scores", json=body, headers=SERVER)
    assert response.status_code == 200, response.text
    model.apply("eu", user, value, None, at, None)


async def walk_pages(
    client: httpx.AsyncClient,
    model: Model,
    board: str,
    scope: str,
    limit: Callable[[], int],
    move: Callable[[set[str]], Awaitable[None]],
) -> None:
    """Read ``scope`` of ``board`` page by page, each page of ``limit()`` entries, and
    ``move`` users between two pages (it adds each it moves to the set it is given). The pages,
    kept to the users that never moved, hold each of them once, in the model's order."""
    seen: list[str] = []
    moved: set[str] = set()
    cursor: str | None = None
    for _ in range(200):
        params: dict[str, Any] = {"scope": scope, "limit": limit()}
        if cursor is not None:
            params["cursor"] = cursor
        path = f"/v1/boards/{board}/leaderboard"
        response = await client.get(path, params=params, headers=SERVER)
        assert response.status_code == 200, response.text
        page = response.json()
        seen += [e["user_id"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        await move(moved)
    else:
        raise AssertionError("the pages never ended")
    still = [row[0] for row in model.ranked(model.regions["eu"]) if row[0] not in moved]
    assert [u for u in seen if u not in moved] == still, (scope, sorted(moved))


async def walk(
    client: httpx.AsyncClient,
    model: Model,
    rng: random.Random,
    board: str,
    scope: str,
    moments: list[int],
) -> None:
    """Up to two users score between two pages."""

    async def move(moved: set[str]) -> None:
        for _ in range(rng.randint(0, 2)):
            user = rng.choice(USERS)
            moved.add(user)
            await score(client, model, board, user, rng.choice([-3, -1, 0, 1, 3]), moments[-1])

    await walk_pages(client, model, board, scope, lambda: rng.choice([1, 2, 3, 5]), move)


@pytest.mark.parametrize("seed", SEEDS)
async def test_pages_neither_repeat_nor_skip_an_entry_that_did_not_move(
    quiet: LadderSettings, redis: Redis, keys: Keys, seed: int
) -> None:
    rng = random.Random(seed)
    operator = rng.choice(["incr", "best", "set"])
    board = Board.model_validate(
        {"board_id": f"pages-{seed}", "operator": operator, "periods": ["alltime"]}
    )
    await add_board(redis, keys, board)
    model = Model(operator, "desc", None)
    base = int((datetime.now(UTC) - timedelta(seconds=300)).timestamp() * 1000)
    moments = sorted(base + rng.randint(0, 200_000) for _ in range(4))
    loose = quiet.model_copy(update={"user_rate": 1e9, "key_rate": 1e9})
    async with api_client(loose) as client:
        for user in USERS:
            await score(client, model, board.board_id, user, rng.randint(0, 3), rng.choice(moments))
        await walk(client, model, rng, board.board_id, "region:eu", moments)
        # A friends scope is one user's group of the global view: the first user befriends all.
        await redis.sadd(keys.friends(USERS[0]), *USERS[1:])
        for user in USERS[1:]:
            await redis.sadd(keys.friends(user), USERS[0])
        await aggregate(redis, keys, board)
        model.regions["eu"] = model.merged()
        await walk_merged(client, redis, keys, model, rng, board, moments)


async def walk_merged(
    client: httpx.AsyncClient,
    redis: Redis,
    keys: Keys,
    model: Model,
    rng: random.Random,
    board: Board,
    moments: list[int],
) -> None:
    """The friends scope moves only when merged: each move is merged before the next page."""

    async def move(moved: set[str]) -> None:
        if rng.random() < 0.5:
            user = rng.choice(USERS)
            moved.add(user)
            await score(client, model, board.board_id, user, rng.choice([-1, 1]), moments[-1])
            await aggregate(redis, keys, board)

    scope = f"friends:{USERS[0]}"
    await walk_pages(client, model, board.board_id, scope, lambda: rng.choice([1, 2, 3]), move)
