"""A consumer started while a dependency it needs is down (docs/api.md section 10): its ops
endpoints answer at once, ``/healthz`` 200 (a liveness probe must not restart a service that is
only waiting) and ``/readyz`` 503 naming the dependency and why; once the dependency answers,
the service opens it and is ready. Each service runs in this process, reaching the dependency
through a relay that the test keeps closed (what a service sees of a server that is down), then
opens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from redis.asyncio import Redis

from services.aggregator import main as aggregator_main
from services.history import main as history_main
from services.notifier import main as notifier_main
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import assert_waiting_on, eventually, in_process, sigterm
from tests.outage import Outage
from tests.stack import free_port

SERVICES: dict[str, Callable[[LadderSettings], Coroutine[Any, Any, None]]] = {
    "aggregator": aggregator_main.run,
    "history": history_main.run,
    "notifier": notifier_main.run,
}


def _relay_of(url: str) -> Outage:
    """A relay in front of the server of ``url``, closed until the test opens it."""
    parts = urlsplit(url)
    return Outage(parts.hostname or "127.0.0.1", parts.port or 0)


async def _ops(port: int) -> tuple[httpx.Response, httpx.Response]:
    """``/healthz`` and ``/readyz`` of the ops port, once it listens (within 5 s)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

        async def listening() -> httpx.Response | None:
            try:
                return await client.get("/healthz")
            except httpx.TransportError:
                return None

        health = await eventually(listening, within=5)
        return health, await client.get("/readyz")


async def _ready(port: int) -> bool:
    async with httpx.AsyncClient(timeout=5) as client:
        answer = await client.get(f"http://127.0.0.1:{port}/readyz")
    return answer.status_code == 200


@pytest.mark.parametrize(
    ("service", "dependency"),
    [
        ("aggregator", "redis"),
        ("notifier", "redis"),
        ("history", "redis"),
        ("history", "mysql"),
    ],
)
async def test_a_consumer_started_with_a_dependency_down_answers_and_says_why(
    service: str,
    dependency: str,
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    mysql_database: str,
) -> None:
    port = free_port()
    setting = "redis_url" if dependency == "redis" else "mysql_url"
    relay = _relay_of(getattr(settings, setting))
    settings = settings.model_copy(
        update={
            setting: relay.through(getattr(settings, setting)),
            f"{service}_port": port,
            "shutdown_grace_seconds": 2.0,
        }
    )
    try:
        async with in_process(SERVICES[service](settings)) as task:
            # Well past the first failed try (0.5 s for Redis, 1 s for MySQL).
            await asyncio.sleep(1.5)
            health, waiting = await _ops(port)
            await relay.restore()
            await eventually(lambda: _ready(port), within=30)
            await sigterm(task)
    finally:
        await relay.cut()

    # What it waits on says why: the error of its last try, one short line with no URL in it.
    body = assert_waiting_on(health, waiting, dependency)
    # The broker is not tried before what the consumer needs first.
    assert body["dependencies"]["broker"] == "down"
    assert body["reasons"]["broker"] == "not connected yet"
    if service == "history" and dependency == "redis":
        # MySQL, opened first, is up.
        assert body["dependencies"]["mysql"] == "up"
