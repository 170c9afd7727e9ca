"""Unroutable messages (docs/reliability.md, "Unroutable messages"): with every queue unbound
from the scores exchange the broker confirms the relay's messages but routes them nowhere. The
relay publishes them mandatory, so they come back: the outbox keeps their events, /readyz and
/metrics say why, and once the queues are bound again each event reaches each queue once."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import CONSUMERS, Topology
from tests.api.helpers import post, score
from tests.helpers import api_client, eventually

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

EVENTS = 6


async def queues_of(
    channel: AbstractChannel, broker: Topology
) -> tuple[AbstractExchange, list[AbstractQueue]]:
    exchange = await channel.get_exchange(broker.scores_exchange)
    queues = [await channel.get_queue(broker.queue(c)) for c in CONSUMERS]
    return exchange, queues


async def readiness(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/readyz")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def metric(text: str, name: str, board: str = "main") -> float:
    found = re.findall(rf'^{name}\{{[^}}]*board_id="{board}"[^}}]*\}} (\S+)$', text, re.MULTILINE)
    return sum(float(value) for value in found)


async def test_unbound_queues_lose_nothing(
    settings: LadderSettings, redis: Redis, channel: AbstractChannel, broker: Topology
) -> None:
    settings = settings.model_copy(update={"shutdown_grace_seconds": 2.0})
    outbox = Keys(settings.key_prefix).outbox("main")
    exchange, queues = await queues_of(channel, broker)
    async with api_client(settings) as client:

        async def relay_connected() -> bool:
            return bool((await readiness(client))["dependencies"]["broker"] == "up")

        # The relay declares the topology as it connects: unbind after that.
        await eventually(relay_connected)
        for queue in queues:
            await queue.unbind(exchange)

        for i in range(EVENTS):
            await post(client, score(event_id=f"u-{i}", user_id=f"user-{i}"))

        async def held_all() -> tuple[dict[str, Any], str] | None:
            # Published again after every score was posted, and returned again: the relay keeps
            # trying, and its record of the return counts every event. (A return of a message
            # published before the last post may be counted just after it, with one event less.)
            body = await readiness(client)
            reason = body["reasons"].get("routing", "")
            if body["dependencies"]["routing"] != "down" or f"{EVENTS} events" not in reason:
                return None
            text = (await client.get("/metrics")).text
            return (body, text) if metric(text, "ladder_relay_unroutable") == EVENTS else None

        ready, metrics = await eventually(held_all, within=15)
        kept = await redis.xlen(outbox)
        depths = [(await channel.declare_queue(q.name, passive=True)) for q in queues]

        for queue in queues:
            await queue.bind(exchange)

        async def outbox_empty() -> bool:
            return await redis.xlen(outbox) == 0

        await eventually(outbox_empty, within=15)

        async def routing_up() -> dict[str, Any] | None:
            body = await readiness(client)
            return body if body["dependencies"]["routing"] == "up" else None

        ready_after = await eventually(routing_up)
        metrics_after = (await client.get("/metrics")).text

    # While unbound: every event kept, nothing in any queue, and both places say why.
    assert kept == EVENTS
    assert [d.declaration_result.message_count for d in depths] == [0, 0, 0]
    assert ready["status"] == "ready"  # the API still takes scores
    reason = ready["reasons"]["routing"]
    assert "board main" in reason and f"{EVENTS} events kept in the outbox" in reason
    assert "NO_ROUTE" in reason and broker.scores_exchange in reason
    assert metric(metrics, "ladder_relay_unroutable") == EVENTS
    # Bound again: routing up, nothing held, and every event in every queue exactly once.
    assert "routing" not in ready_after["reasons"]
    assert metric(metrics_after, "ladder_relay_unroutable") == 0
    for queue in queues:
        seen: Counter[str] = Counter()
        while (message := await queue.get(fail=False, no_ack=True)) is not None:
            seen.update(e["event_id"] for e in orjson.loads(message.body)["events"])
        assert seen == Counter({f"u-{i}": 1 for i in range(EVENTS)}), queue.name
