"""`make stop SERVICE=notifier`: writes stay as fast, its queue grows, and drains after start."""

from __future__ import annotations

import statistics
import time
import uuid

import httpx
import pytest

from shared.amqp import connect as connect_broker
from tests.helpers import SERVER, eventually
from tests.stack import Stack

pytestmark = pytest.mark.stack

POSTS = 150


async def post_many(api: httpx.AsyncClient, count: int) -> list[float]:
    """Sequential POSTs, each by a user of its own (so no per-user limit applies); seconds each."""
    latencies = []
    for i in range(count):
        body = {"user_id": f"u{i}-{uuid.uuid4().hex[:6]}", "region": "eu", "value": i % 50}
        started = time.perf_counter()
        response = await api.post("/v1/boards/main/scores", json=body)
        latencies.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return latencies


async def test_writes_do_not_wait_for_a_stopped_notifier(stack: Stack) -> None:
    queue_name = f"{stack.settings.broker_prefix}.scores.notifier"
    connection = await connect_broker(stack.settings.amqp_urls)
    async with connection, httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
        channel = await connection.channel()

        async def depth() -> int:
            queue = await channel.declare_queue(queue_name, passive=True)
            return int(queue.declaration_result.message_count or 0)

        await post_many(api, 30)  # warm up connections and caches
        before = statistics.median(await post_many(api, POSTS))

        stack.make("stop", "SERVICE=notifier")
        assert "STOPPED" in next(
            line for line in stack.make("ps").splitlines() if line.startswith("notifier")
        )
        during = statistics.median(await post_many(api, POSTS))
        backlog = await eventually(depth)
        print(
            f"median POST latency: {before * 1000:.2f} ms with the notifier, "
            f"{during * 1000:.2f} ms without (ratio {during / before:.2f}); "
            f"notifier queue: {backlog} messages"
        )
        assert during <= 2 * before, "writes slowed down while the notifier was stopped"

        # More writes while it is still stopped: the queue keeps growing.
        await post_many(api, 20)
        assert await eventually(lambda: _grew(depth, backlog)) > backlog

        stack.make("start", "SERVICE=notifier")
        stack.wait_ready("notifier")

        async def drained() -> bool:
            return await depth() == 0

        assert await eventually(drained, within=30)


async def _grew(depth: object, than: int) -> int | None:
    now: int = await depth()  # type: ignore[operator]
    return now if now > than else None
