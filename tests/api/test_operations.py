"""The operations endpoints (docs/api.md section 10): health, readiness, metrics, the OpenAPI
document, and the API with its broker down.
"""

from __future__ import annotations

import asyncio
import gc
import re
import warnings
from collections.abc import Awaitable
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.api.helpers import SCORES, post, score
from tests.helpers import SERVER, api_client, eventually

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


def scores_counted(metrics: str, outcome: str) -> float:
    match = re.search(
        rf'^ladder_api_scores_total\{{outcome="{outcome}"\}} (\S+)$', metrics, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


async def test_health_readiness_metrics_and_openapi(
    settings: LadderSettings, redis: Redis, broker: Topology, mysql_database: str
) -> None:
    settings = settings.model_copy(update={"shutdown_grace_seconds": 2.0})
    outbox = Keys(settings.key_prefix).outbox("main")
    async with api_client(settings) as client:
        health = await client.get("/healthz")

        async def broker_up() -> dict[str, Any] | None:
            response = await client.get("/readyz")
            body: dict[str, Any] = response.json()
            return body if body["dependencies"]["broker"] == "up" else None

        ready = await eventually(broker_up)
        before = (await client.get("/metrics")).text
        await post(client, score(event_id="m-1"))
        await post(client, score(event_id="m-1"))
        metrics = await client.get("/metrics")
        openapi = await client.get("/openapi.json")
        # With the broker up, the relay empties the outbox.
        await eventually(lambda: _is_zero(redis.xlen(outbox)))

    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    assert ready["status"] == "ready"
    assert {"redis", "broker", "mysql"} <= ready["dependencies"].keys()
    assert ready["dependencies"]["redis"] == "up"
    assert ready["dependencies"]["mysql"] == "up"
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "ladder_api_scores_total" in metrics.text
    assert scores_counted(metrics.text, "accepted") == scores_counted(before, "accepted") + 1
    assert scores_counted(metrics.text, "duplicate") == scores_counted(before, "duplicate") + 1
    paths = openapi.json()["paths"]
    assert "post" in paths["/v1/boards/{board_id}/scores"]
    assert "get" in paths["/v1/boards/{board_id}/leaderboard"]


async def _is_zero(count: Awaitable[int]) -> bool:
    return await count == 0


async def test_with_the_broker_down_the_api_is_ready_and_accepts_scores(
    quiet: LadderSettings, redis: Redis, mysql_database: str
) -> None:
    async with api_client(quiet) as client:
        ready = await client.get("/readyz")
        response = await client.post(SCORES, json=score(), headers=SERVER)

    assert ready.status_code == 200
    assert ready.json()["dependencies"]["broker"] == "down"
    assert ready.json()["dependencies"]["redis"] == "up"
    assert response.status_code == 200
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 1


async def test_refused_scores_are_counted_as_rejected_in_a_post_as_in_a_batch(
    quiet: LadderSettings, redis: Redis, mysql_database: str
) -> None:
    # The credential's bucket holds one token, so that a batch after one write is refused whole.
    limited = quiet.model_copy(update={"key_rate": 1.0})
    async with api_client(limited) as client:
        before = (await client.get("/metrics")).text
        await post(client, score(event_id="r-1", value=1))
        conflict = await client.post(SCORES, json=score(event_id="r-1", value=2), headers=SERVER)
        invalid = await client.post(SCORES, json=score(value=2**53), headers=SERVER)
        middle = (await client.get("/metrics")).text
        batch = await client.post(
            SCORES + "/batch",
            json={"events": [score(event_id="r-2"), score(event_id="r-3")]},
            headers=SERVER,
        )
        after = (await client.get("/metrics")).text

    assert (conflict.status_code, invalid.status_code, batch.status_code) == (409, 422, 429)
    assert scores_counted(middle, "accepted") == scores_counted(before, "accepted") + 1
    # Each refused single POST counts, as each refused event of a batch does...
    assert scores_counted(middle, "rejected") == scores_counted(before, "rejected") + 2
    # ... and so does each event of a batch the credential refused whole.
    assert scores_counted(after, "rejected") == scores_counted(middle, "rejected") + 2


async def test_shutdown_closes_the_hubs_redis_connection(
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = settings.model_copy(update={"shutdown_grace_seconds": 2.0})
    real_aclose = Redis.aclose

    async def slow_aclose(self: Redis, *args: Any, **kwargs: Any) -> None:
        # Widens the window that shutdown has to cut a close short; a close that is let
        # finish is only slower.
        await asyncio.sleep(0.5)
        await real_aclose(self, *args, **kwargs)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with api_client(settings) as client:
            # The relay connected: at shutdown it takes longer to stop than the idle hub.
            await eventually(lambda: _broker_is_up(client))
            monkeypatch.setattr(Redis, "aclose", slow_aclose)
        monkeypatch.undo()
        gc.collect()

    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == []


async def _broker_is_up(client: httpx.AsyncClient) -> bool:
    response = await client.get("/readyz")
    return bool(response.json()["dependencies"]["broker"] == "up")
