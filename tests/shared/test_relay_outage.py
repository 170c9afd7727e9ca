"""What the relays and the consumers show while the broker is away or refuses the topology
(docs/operations.md, "The metrics that matter"): the backlog gauges follow the outboxes' length
with no broker to publish to, every failed connection attempt is counted, the connected gauges
say 0, and a topology the broker refuses (a queue declared with another ``x-delivery-limit``) is
a configuration error naming the queue, the argument and the setting, on which a consumer waits
rather than exits, and starts once the queue is right. ``/readyz`` says why, with no address."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from aio_pika.abc import AbstractChannel
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from structlog.testing import capture_logs

from services.aggregator.period_relay import PeriodRelay
from services.api.relay.outbox import Relay
from shared.amqp import connect as connect_broker
from shared.boards import BoardCatalog
from shared.consumer import ConsumerRunner
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.ops import ops_app
from shared.relaying import StreamRelay
from shared.service import checks_of
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import UNREACHABLE_BROKER, eventually


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


@contextlib.asynccontextmanager
async def relaying(relay: StreamRelay) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(relay.relay_until(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_the_api_relay_with_no_broker_gauges_its_outbox_and_counts_its_attempts(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    relay = Relay(redis, keys, catalog, quiet)
    for n in range(30):
        await redis.xadd(keys.outbox("main"), {"e": str(n)})
    attempts = sample("ladder_relay_failures_total", {"stage": "connect"})

    async with relaying(relay):

        async def gauged(n: int) -> bool:
            return sample("ladder_relay_backlog", {"board_id": "main"}) == n

        await eventually(lambda: gauged(30))
        # Writes go on meanwhile: the gauge follows them, not only a publish round.
        for n in range(5):
            await redis.xadd(keys.outbox("main"), {"e": f"more-{n}"})
        await eventually(lambda: gauged(35))

        async def counted() -> bool:
            return sample("ladder_relay_failures_total", {"stage": "connect"}) >= attempts + 2

        await eventually(counted)
        assert sample("ladder_relay_connected") == 0
        assert not relay.ready
        reason = relay.last_error or ""
        assert "AMQPConnectionError" in reason, reason
        assert "guest" not in reason and "amqp://" not in reason, reason


async def test_the_period_relay_with_no_broker_gauges_its_outbox_and_counts_its_attempts(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    relay = PeriodRelay(redis, keys, catalog, quiet)
    for n in range(3):
        await redis.xadd(keys.periods_outbox("main"), {"m": str(n)})
    attempts = sample("ladder_periods_publish_failures_total", {"stage": "connect"})

    async with relaying(relay):

        async def gauged() -> bool:
            return sample("ladder_periods_backlog", {"board_id": "main"}) == 3

        async def counted() -> bool:
            found = sample("ladder_periods_publish_failures_total", {"stage": "connect"})
            return found >= attempts + 2

        await eventually(gauged)
        await eventually(counted)
        assert sample("ladder_periods_relay_connected") == 0


async def test_a_connected_relay_shows_it_and_gauges_a_drained_outbox_empty(
    settings: LadderSettings, redis: Redis, keys: Keys, channel: AbstractChannel
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    relay = Relay(redis, keys, catalog, settings)
    # Gauged while the broker was away: the gauge comes down once the outbox drains.
    relay._set_backlog(["main"], {"main": 7})
    async with relaying(relay):

        async def connected() -> bool:
            return relay.ready and sample("ladder_relay_connected") == 1

        await eventually(connected)
        await eventually(
            lambda: asyncio.sleep(0, sample("ladder_relay_backlog", {"board_id": "main"}) == 0)
        )
        assert relay.last_error is None
    assert sample("ladder_relay_connected") == 0


async def test_a_relay_told_the_topology_is_refused_logs_a_configuration_error(
    settings: LadderSettings, redis: Redis, keys: Keys, channel: AbstractChannel
) -> None:
    changed = settings.model_copy(update={"delivery_limit": 21})
    relay = Relay(redis, keys, BoardCatalog(redis, keys), changed)
    attempts = sample("ladder_relay_failures_total", {"stage": "connect"})
    with capture_logs() as logs:
        async with relaying(relay):
            await eventually(
                lambda: asyncio.sleep(0, "x-delivery-limit" in (relay.last_error or ""))
            )
            await eventually(
                lambda: asyncio.sleep(
                    0, sample("ladder_relay_failures_total", {"stage": "connect"}) > attempts
                )
            )
    reason = relay.last_error or ""
    assert f"queue {settings.broker_prefix}.scores." in reason, reason
    assert "LADDER_DELIVERY_LIMIT" in reason, reason
    refused = [entry for entry in logs if "configuration error" in entry["event"]]
    assert refused, logs
    assert refused[0]["log_level"] == "error"
    assert refused[0]["argument"] == "x-delivery-limit"
    assert refused[0]["setting"] == "LADDER_DELIVERY_LIMIT"
    assert refused[0]["queue"].startswith(f"{settings.broker_prefix}.scores.")
    assert not [entry for entry in logs if entry["event"].startswith("broker unavailable")]


async def nothing(_: list[ScoreAccepted]) -> None:
    return None


async def readiness(runner: ConsumerRunner, redis: Redis) -> dict[str, Any]:
    app = ops_app(checks_of(runner, redis), {"broker", "redis"}, runner.reasons)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ops") as client:
        response = await client.get("/readyz")
    body: dict[str, Any] = response.json()
    body["status_code"] = response.status_code
    return body


async def test_a_consumer_waits_out_a_refused_topology_and_starts_once_it_is_right(
    settings: LadderSettings, redis: Redis, channel: AbstractChannel
) -> None:
    runner = ConsumerRunner(
        name="notifier",
        amqp_url=settings.amqp_url,
        topology=Topology(settings.broker_prefix, delivery_limit=21),
        handler=nothing,
    )
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        try:
            await eventually(
                lambda: asyncio.sleep(
                    0,
                    "broker" in runner.reasons()
                    and any("configuration error" in entry["event"] for entry in logs),
                )
            )
            assert not task.done(), "the consumer ended instead of waiting"
            assert not runner.ready
            body = await readiness(runner, redis)
            assert body["status_code"] == 503
            assert body["dependencies"]["broker"] == "down"
            assert "x-delivery-limit" in body["reasons"]["broker"], body
            assert "LADDER_DELIVERY_LIMIT" in body["reasons"]["broker"], body

            # The operator deletes the queues declared with the old limit: the next try declares
            # them anew, and the consumer starts by itself.
            connection = await connect_broker(settings.amqp_urls)
            async with connection:
                await Topology(settings.broker_prefix).delete(await connection.channel())
            await eventually(lambda: asyncio.sleep(0, runner.ready), within=20)
            body = await readiness(runner, redis)
            assert body["status_code"] == 200 and body["reasons"] == {}, body
        finally:
            runner.stop()
            await asyncio.wait_for(task, 10)
    refused = [entry for entry in logs if "configuration error" in entry["event"]]
    assert refused[0]["log_level"] == "error"
    assert refused[0]["queue"].startswith(f"{settings.broker_prefix}.scores.")
    assert refused[0]["argument"] == "x-delivery-limit"


async def test_a_consumer_s_readiness_says_why_with_no_address(
    quiet: LadderSettings, redis: Redis
) -> None:
    runner = ConsumerRunner(
        name="history",
        amqp_url=quiet.amqp_url,
        topology=Topology(quiet.broker_prefix),
        handler=nothing,
    )
    task = asyncio.create_task(runner.run())
    try:
        await eventually(
            lambda: asyncio.sleep(0, "AMQPConnectionError" in runner.reasons().get("broker", ""))
        )
        body = await readiness(runner, redis)
        assert body["status_code"] == 503
        assert body["dependencies"] == {"broker": "down", "redis": "up"}
        assert set(body["reasons"]) == {"broker"}
        assert "guest" not in body["reasons"]["broker"] and "amqp" not in body["reasons"]["broker"]
        # Never connected: the gauge says 0 all the same (an alert on it needs a sample).
        assert REGISTRY.get_sample_value("ladder_consumer_connected", {"consumer": "history"}) == 0
    finally:
        runner.stop()
        await asyncio.wait_for(task, 10)
    assert quiet.amqp_url == UNREACHABLE_BROKER


async def test_a_check_that_raises_says_why_and_a_held_batch_says_on_what() -> None:
    async def up() -> bool:
        return True

    async def mysql() -> bool:
        raise ConnectionRefusedError("mysql+asyncmy://root:s3cret@db:3306/ladder refused")

    runner = ConsumerRunner(name="history", amqp_url="", topology=Topology(), handler=nothing)
    runner._handler_error = "OperationalError: (2003, Can't connect to MySQL server)"
    app = ops_app({"broker": up, "mysql": mysql}, {"broker", "mysql"}, runner.reasons)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://ops"
    ) as client:
        body = (await client.get("/readyz")).json()
    assert body["dependencies"] == {"broker": "up", "mysql": "down"}
    # The broker check is up: what the runner says about it is left out.
    assert set(body["reasons"]) == {"mysql", "handler"}, body
    assert (
        "s3cret" not in body["reasons"]["mysql"]
        and "ConnectionRefusedError" in body["reasons"]["mysql"]
    )
    assert "Can't connect to MySQL server" in body["reasons"]["handler"]
