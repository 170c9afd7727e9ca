"""A poison message and a message holding an event that fails the schema, through the real
broker, the aggregator's and history's real handlers, Redis and MySQL (docs/api.md section 11,
docs/operations.md "A poison message"): each is dead-lettered to the consumer's own ``.dead``
queue and counted, and ``make replay-dead`` (scripts/replay_dead.py) sends them back to that
consumer alone, which counts, lists and stores nothing twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from scripts.replay_dead import replay
from services.aggregator import main as aggregator
from services.aggregator.fresh import FreshRegions
from services.history import main as history
from shared.boards import BoardCatalog
from shared.consumer import ConsumerRunner, Handler
from shared.db import count_events, open_engine
from shared.events import message_body, with_outbox_id
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Consumer, Topology
from tests.api.helpers import get_ok, post, score
from tests.helpers import UNREACHABLE_BROKER, api_client
from tests.helpers import consuming as runner_consuming

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

WAIT = 20.0


@pytest.fixture
async def db(settings: LadderSettings, mysql_database: str) -> AsyncIterator[AsyncEngine]:
    async with open_engine(settings.mysql_url, changed_rows=True) as engine:
        yield engine


@contextlib.asynccontextmanager
async def consuming(
    settings: LadderSettings, broker: Topology, name: Consumer, handler: Handler
) -> AsyncIterator[None]:
    runner = ConsumerRunner(name=name, amqp_url=settings.amqp_url, topology=broker, handler=handler)
    async with runner_consuming(runner, WAIT):
        yield


def sample(consumer: str, outcome: str) -> float:
    labels = {"consumer": consumer, "outcome": outcome}
    return REGISTRY.get_sample_value("ladder_consumer_messages_total", labels) or 0.0


async def depth(channel: AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.message_count or 0)


async def until_depth(channel: AbstractChannel, queue: str, wanted: int) -> None:
    async with asyncio.timeout(WAIT):
        while await depth(channel, queue) != wanted:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def bodies(settings: LadderSettings, redis: Redis, keys: Keys) -> tuple[bytes, bytes]:
    """Two events accepted by the API (its outbox holding them, no broker): a message of the
    two with an event the schema refuses between them, and a body that is no message."""
    quiet = settings.model_copy(update={"amqp_url": UNREACHABLE_BROKER})
    async with api_client(quiet) as client:
        for user, value in (("u-1", 7), ("u-3", 5)):
            await post(client, score(user_id=user, value=value, event_id=f"e-{user}"))
    entries: list[Any] = await redis.xrange(keys.outbox("main"))
    good = [with_outbox_id(entry_id, fields["e"]) for entry_id, fields in entries]
    bad = json.loads(good[0]) | {"event_id": "e-bad", "value": "not a number"}
    return message_body([good[0], json.dumps(bad), good[1]]), b"{not json"


async def views(settings: LadderSettings) -> tuple[int, list[str]]:
    quiet = settings.model_copy(update={"amqp_url": UNREACHABLE_BROKER})
    async with api_client(quiet) as client:
        stats = await get_ok(client, "/v1/boards/main/stats", period="alltime")
        feed = await get_ok(client, "/v1/boards/main/feed", limit=50)
    return stats["events"], sorted(e["event_id"] for e in feed["events"])


async def test_poison_is_dead_lettered_counted_and_replayed_without_doubling(
    settings: LadderSettings,
    redis: Redis,
    keys: Keys,
    broker: Topology,
    channel: AbstractChannel,
    db: AsyncEngine,
) -> None:
    split, poison = await bodies(settings, redis, keys)
    catalog = BoardCatalog(redis, keys)
    handlers: dict[Consumer, Handler] = {
        "aggregator": aggregator.batch_handler(redis, keys, catalog, settings, FreshRegions()),
        "history": history.batch_handler(db, redis, keys, settings),
    }
    before = {(c, o): sample(c, o) for c in handlers for o in ("poison", "poison-split")}
    exchange = await channel.get_exchange(broker.scores_exchange)
    for body in (split, poison):
        await exchange.publish(aio_pika.Message(body, message_id=body[:8].hex()), routing_key="")

    for rounds in (1, 2):
        async with (
            consuming(settings, broker, "aggregator", handlers["aggregator"]),
            consuming(settings, broker, "history", handlers["history"]),
        ):
            for name in handlers:
                await until_depth(channel, broker.dead_queue(name), 2)
        for name in handlers:
            assert await depth(channel, broker.queue(name)) == 0
            # Counted each time taken: the aggregator's twice, its dead letters replayed.
            times = rounds if name == "aggregator" else 1
            for outcome in ("poison", "poison-split"):
                assert sample(name, outcome) == before[(name, outcome)] + times
        # The two good events: counted, listed and stored once, however often handed over.
        assert await views(settings) == (2, ["e-u-1", "e-u-3"])
        assert await count_events(db, "main") == 2
        # The aggregator's dead letters back to its own queue alone: history's stay put.
        assert await replay(settings, "aggregator") == 2
        assert await depth(channel, broker.dead_queue("aggregator")) == 0
        assert await depth(channel, broker.queue("history")) == 0
