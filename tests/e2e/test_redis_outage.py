"""The aggregator and the notifier with their Redis away: they run on the same consumer runner as
history, so an outage holds their batches without counting toward the delivery limit, nothing
is dead-lettered, and once Redis is back every event is handled. Scores are posted to the real
API (its own Redis connection stays up) and relayed through the real broker; the service runs in
this process, reaching Redis through a relay the test cuts."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from services.aggregator import main as aggregator_main
from services.notifier import main as notifier_main
from shared.amqp import connect as connect_broker
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import CONSUMERS, Topology
from tests.api.helpers import post, score
from tests.helpers import api_client, eventually, global_entry, in_process, sigterm
from tests.outage import redis_relayed
from tests.stack import free_port

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

# An outage that counted toward the delivery limit would dead-letter after 2 attempts. (Each
# attempt takes seconds here: redis-py retries a refused connection itself first.)
LIMIT = 1
USERS = ("u-a", "u-b", "u-c")


def handled(consumer: str) -> float:
    return REGISTRY.get_sample_value("ladder_consumer_events_total", {"consumer": consumer}) or 0.0


def failed(consumer: str) -> float:
    labels = {"consumer": consumer}
    return REGISTRY.get_sample_value("ladder_consumer_handler_failures_total", labels) or 0.0


SERVICES: dict[str, Callable[[LadderSettings], Coroutine[Any, Any, None]]] = {
    "aggregator": aggregator_main.run,
    "notifier": notifier_main.run,
}


@contextlib.asynccontextmanager
async def running(consumer: str, settings: LadderSettings) -> AsyncIterator[None]:
    """The service's own run, in this process, for the block; stopped as a process manager
    stops it (SIGTERM)."""
    async with in_process(SERVICES[consumer](settings)) as service:
        yield
        # Consuming means the service's signal handlers are in place.
        await sigterm(service)


@pytest.mark.parametrize("consumer", ["aggregator", "notifier"])
async def test_a_consumer_holds_its_batch_while_redis_is_away(
    consumer: str,
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    mysql_database: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = settings.model_copy(update={"delivery_limit": LIMIT, "shutdown_grace_seconds": 2.0})
    keys = Keys(settings.key_prefix)
    async with redis_relayed(settings, monkeypatch) as outage:
        away = settings.model_copy(
            update={
                "redis_url": outage.url,
                "aggregator_port": free_port(),
                "notifier_port": free_port(),
            }
        )
        async with api_client(settings) as client, running(consumer, away):
            # Consuming: a first score handled.
            before = handled(consumer)
            await post(client, score(event_id="first", user_id="u-0"))

            async def first_handled() -> bool:
                return handled(consumer) > before

            await eventually(first_handled, within=20)

            await outage.cut()
            failed_before, handled_before = failed(consumer), handled(consumer)
            for user in USERS:
                await post(client, score(event_id=f"during-{user}", user_id=user))

            async def failed_past_the_limit() -> bool:
                return failed(consumer) - failed_before > LIMIT + 1

            await eventually(failed_past_the_limit, within=60)
            handled_during = handled(consumer) - handled_before

            await outage.restore()

            async def all_handled() -> bool:
                return handled(consumer) - handled_before >= len(USERS)

            await eventually(all_handled, within=30)
            if consumer == "aggregator":
                # And its ticker merged them into the global view.

                async def all_merged() -> bool:
                    entries = [await global_entry(redis, keys, user) for user in USERS]
                    return all(entry is not None for entry in entries)

                await eventually(all_merged, within=20)
            connection = await connect_broker(settings.amqp_urls)
            async with connection:
                channel = await connection.channel()
                dead = [
                    (
                        await channel.declare_queue(broker.dead_queue(c), passive=True)
                    ).declaration_result.message_count
                    for c in CONSUMERS
                ]

    assert handled_during == 0
    assert dead == [0, 0, 0]
