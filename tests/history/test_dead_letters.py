"""What the history service does with events it cannot store, on the real broker and MySQL: an
event MySQL refuses is dead-lettered after the documented deliveries while the rest flows on; an
outage of MySQL or Redis dead-letters nothing and the events are stored once it is over."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aio_pika
import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history import main as history_main
from shared.amqp import connect as connect_broker
from shared.db import count_events
from shared.events import message_body
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import accepted_event as accepted
from tests.helpers import in_process, sigterm
from tests.outage import Outage, redis_relayed, relayed

WAIT = 30.0


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def outcome(kind: str) -> float:
    return sample("ladder_consumer_messages_total", consumer="history", outcome=kind)


def failures() -> float:
    return sample("ladder_consumer_handler_failures_total", consumer="history")


async def until(condition: Callable[[], Awaitable[bool]], within: float = WAIT) -> None:
    async with asyncio.timeout(within):
        # Polling: MySQL and the broker's counts have no change notification to wait on.
        while not await condition():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def channel_of(settings: LadderSettings) -> AsyncIterator[AbstractChannel]:
    """A channel on which the topology of ``settings`` exists (before the service starts, so
    nothing published first is lost)."""
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        chan = await connection.channel(publisher_confirms=True)
        await Topology(settings.broker_prefix, settings.delivery_limit).declare(chan)
        yield chan


async def publish(channel: AbstractChannel, settings: LadderSettings, *events: str) -> None:
    exchange = await channel.get_exchange(f"{settings.broker_prefix}.scores")
    message = aio_pika.Message(
        message_body(list(events)),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=uuid.uuid4().hex,
    )
    await exchange.publish(message, routing_key="")


async def depth(channel: AbstractChannel, queue: str) -> int:
    """Messages ready in ``queue`` (not those delivered and unacked)."""
    declared = await channel.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    return int(count or 0)


async def take_all(channel: AbstractChannel, queue: str) -> list[AbstractIncomingMessage]:
    declared = await channel.declare_queue(queue, passive=True)
    taken = []
    while (message := await declared.get(fail=False, no_ack=True)) is not None:
        taken.append(message)
    return taken


@contextlib.asynccontextmanager
async def history_service(settings: LadderSettings) -> AsyncIterator[None]:
    """``python -m services.history``'s run, in this process, for the block; stopped as a
    process manager stops it (SIGTERM)."""
    # Port 0: the health server binds whatever port is free at that moment (a port picked
    # before and bound later may be taken meanwhile; it was, once, on a busy rehearsal).
    run = history_main.run(settings.model_copy(update={"history_port": 0}))
    async with in_process(run, WAIT) as service:
        yield
        # Consuming means the service's signal handlers are in place.
        await sigterm(service, WAIT)


async def stored(db: AsyncEngine, *event_ids: str) -> bool:
    counts = [await count_events(db, "main", event_id) for event_id in event_ids]
    return counts == [1] * len(event_ids)


async def test_an_event_mysql_refuses_is_dead_lettered_and_the_rest_is_stored(
    settings: LadderSettings, broker: Topology, db: AsyncEngine
) -> None:
    # The refusal: a CHECK constraint in the test's own database, which value 666 violates.
    async with db.begin() as conn:
        await conn.execute(
            text("ALTER TABLE score_events ADD CONSTRAINT refuse_666 CHECK (value <> 666)")
        )
    refused_before, dead_before = outcome("refused"), outcome("dead-lettered")
    dead_queue = broker.dead_queue("history")

    async with channel_of(settings) as channel, history_service(settings):
        await publish(channel, settings, accepted("e-1").model_dump_json())
        # The poison between two good events of one message.
        await publish(
            channel,
            settings,
            accepted("e-2").model_dump_json(),
            accepted("e-3", value=666).model_dump_json(),
            accepted("e-4").model_dump_json(),
        )
        # The stream flows on while the poison goes round.
        await until(lambda: stored(db, "e-1", "e-2", "e-4"))
        await publish(channel, settings, accepted("e-5").model_dump_json())
        await until(lambda: stored(db, "e-5"))

        async def dead_lettered() -> bool:
            return await depth(channel, dead_queue) == 1

        await until(dead_lettered)
        dead = await take_all(channel, dead_queue)
        left = await depth(channel, broker.queue("history"))

    assert await count_events(db, "main") == 4
    assert await count_events(db, "main", "e-3") == 0
    # The message holding the refused event, whole, once, for an operator to look at.
    assert len(dead) == 1
    body = orjson.loads(dead[0].body)
    assert [e["event_id"] for e in body["events"]] == ["e-2", "e-3", "e-4"]
    headers = dead[0].headers
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert headers["x-first-death-queue"] == broker.queue("history")
    # Delivered LADDER_DELIVERY_LIMIT + 1 times: refused and requeued 20 times, the 21st
    # refusal dead-letters it (docs/reliability.md).
    assert settings.delivery_limit == 20
    assert outcome("refused") - refused_before == settings.delivery_limit
    assert outcome("dead-lettered") - dead_before == 1
    assert left == 0


def proxied(url: str, outage: Outage) -> str:
    return make_url(url).set(host="127.0.0.1", port=outage.port).render_as_string(False)


def target_of(url: str) -> tuple[str, int]:
    parsed = make_url(url)
    return parsed.host or "127.0.0.1", parsed.port or 3306


# A small delivery limit: an outage that counted toward it would dead-letter after 3 attempts.
OUTAGE_LIMIT = 2


@pytest.fixture
def outage_settings(settings: LadderSettings) -> LadderSettings:
    return settings.model_copy(update={"delivery_limit": OUTAGE_LIMIT})


async def test_a_mysql_outage_dead_letters_nothing_and_the_events_are_stored_after(
    outage_settings: LadderSettings, broker: Topology, db: AsyncEngine
) -> None:
    async with relayed(*target_of(outage_settings.mysql_url)) as mysql:
        settings = outage_settings.model_copy(
            update={"mysql_url": proxied(outage_settings.mysql_url, mysql)}
        )
        async with channel_of(settings) as channel, history_service(settings):
            await publish(channel, settings, accepted("e-0").model_dump_json())
            await until(lambda: stored(db, "e-0"))

            await mysql.cut()
            failed_before = failures()
            for i in (1, 2, 3):
                await publish(channel, settings, accepted(f"e-{i}").model_dump_json())

            async def failed_past_the_limit() -> bool:
                return failures() - failed_before > OUTAGE_LIMIT + 2

            await until(failed_past_the_limit)
            dead_during = await depth(channel, broker.dead_queue("history"))
            stored_during = await count_events(db, "main")

            await mysql.restore()
            await until(lambda: stored(db, "e-1", "e-2", "e-3"))
            dead_after = await depth(channel, broker.dead_queue("history"))

    assert dead_during == 0
    assert stored_during == 1
    assert dead_after == 0
    assert await count_events(db, "main") == 4


async def test_a_redis_outage_dead_letters_nothing_and_the_views_are_marked_after(
    outage_settings: LadderSettings,
    broker: Topology,
    db: AsyncEngine,
    redis: Redis,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """History's second step marks the changed views in Redis: with Redis away the batch is
    held (stored in MySQL already, which a retry finds done) and nothing is dead-lettered."""
    async with redis_relayed(outage_settings, monkeypatch) as cut_redis:
        settings = outage_settings.model_copy(update={"redis_url": cut_redis.url})
        async with channel_of(settings) as channel, history_service(settings):

            async def marked() -> bool:
                return bool(await redis.exists(keys.snapshot_dirty("main")))

            await publish(channel, settings, accepted("e-0").model_dump_json())
            await until(marked)
            await redis.delete(keys.snapshot_dirty("main"))

            await cut_redis.cut()
            failed_before = failures()
            await publish(channel, settings, accepted("e-1").model_dump_json())

            async def failed_past_the_limit() -> bool:
                return failures() - failed_before > OUTAGE_LIMIT + 2

            await until(failed_past_the_limit)
            marked_during = await redis.exists(keys.snapshot_dirty("main"))
            dead_during = await depth(channel, broker.dead_queue("history"))

            await cut_redis.restore()
            await until(marked)
            dead_after = await depth(channel, broker.dead_queue("history"))

    assert marked_during == 0
    assert dead_during == 0
    assert dead_after == 0
    assert await count_events(db, "main", "e-1") == 1
