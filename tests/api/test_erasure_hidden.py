"""An erasure finds a hidden user's records (docs/api.md section 8b) in every period the board
kept, the ones its definition no longer names included: a view whose only entry is hidden has
records and no sorted set, and the user's records must go all the same, or a fresh user of that
id would take the erased user's score back when the period is named again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.events import rfc3339
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import done
from tests.helpers import ADMIN, SERVER, api_client, eventually


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def put_board(client: httpx.AsyncClient, periods: list[str]) -> None:
    spec = {"periods": periods, "regions": ["eu", "us"]}
    answer = await client.put("/v1/boards/arena", json=spec, headers=ADMIN)
    assert answer.status_code in (200, 201), answer.text


async def write(client: httpx.AsyncClient, value: int, metadata: dict[str, Any] | None) -> Any:
    body: dict[str, Any] = {"user_id": "u-a", "region": "us", "value": value}
    body["occurred_at"] = rfc3339(datetime.now(UTC))
    if metadata is not None:
        body["metadata"] = metadata
    answer = await client.post("/v1/boards/arena/scores", json=body, headers=SERVER)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_a_hidden_users_records_go_from_a_period_the_board_no_longer_names(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await put_board(client, ["alltime", "daily"])
        hidden = await client.put("/v1/boards/arena/users/u-a/hidden", headers=ADMIN)
        assert hidden.status_code == 204, hidden.text
        await write(client, 50, {"email": "ana@example.com"})
        await put_board(client, ["alltime"])
        assert (await client.delete("/v1/users/u-a", headers=ADMIN)).status_code == 202
        await eventually(lambda: done(client, "/v1/erasures/u-a"), within=15)

        left = [
            key
            async for key in redis.scan_iter(match=f"{keys.tag('arena')}:lb:*:ties")
            if await redis.hexists(key, "u-a")
        ]
        assert left == []

        # The period named again: a fresh user of that id starts from nothing there.
        await put_board(client, ["alltime", "daily"])
        fresh = await write(client, 5, None)
        assert fresh["periods"]["daily"]["score"] == 5
        assert fresh["periods"]["daily"]["previous_rank"] is None
        assert fresh["periods"]["alltime"]["score"] == 5
