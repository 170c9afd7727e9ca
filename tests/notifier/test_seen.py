"""The notifier's seen marks: an event is marked handled in the step that publishes its messages,
so a batch whose publishes failed is handled again, whole, on its redelivery, and an event
delivered to two notifiers at once is published by one of them."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.notifier import handlers
from services.notifier.handlers import Notify
from shared.boards import BoardCatalog
from shared.consumer import ConsumerRunner
from shared.events import ScoreAccepted, message_body
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.notifier.test_badges import (
    NOTIFIER_BIT,
    QUEST,
    accepted,
    add_board,
    badge_message,
    listening,
)


@pytest.fixture
async def notify(redis: Redis, keys: Keys) -> Notify:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    await add_board(redis, keys, QUEST)
    return Notify(redis, keys, catalog)


async def test_an_event_whose_rank_push_failed_is_not_marked_and_pushes_on_redelivery(
    notify: Notify, redis: Redis, keys: Keys
) -> None:
    event = accepted(150)  # enters the top, and earns the bronze badge
    record = keys.idempotency("quest", event.event_id, event.user_id)
    async with listening(redis, keys.user_channel("u-1")) as channel:
        # The call that publishes and marks fails (as one to a function the Redis does not hold).
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(handlers, "NOTIFY_FUNCTION", "ladder_missing_v1")
            with pytest.raises(ResponseError):
                await notify([event])
        # The badge's own call went through; the rank message did not, nor did the mark.
        assert await redis.getbit(record, NOTIFIER_BIT) == 0
        assert await channel.drain() == [badge_message("bronze")]
        # The broker delivers the batch again: the rank message goes out, the badge not again.
        await notify([event])
        assert await redis.getbit(record, NOTIFIER_BIT) == 1
        heard = await channel.drain()
    assert [m["reason"] for m in heard if m["type"] == "rank"] == ["entered_top"]
    assert [m for m in heard if m["type"] == "badge"] == []
    # Handled now: a further delivery pushes nothing.
    async with listening(redis, keys.user_channel("u-1")) as channel:
        await notify([event])
        assert await channel.drain() == []


async def test_an_event_delivered_to_two_notifiers_at_once_is_published_once(
    redis: Redis, keys: Keys
) -> None:
    """Competing consumers of one queue: a message the relay published twice (or redelivered
    while its first delivery is still being handled) reaches two notifiers, each of which reads
    the event as not handled yet before either has published. One pushes it; both mark it."""
    await add_board(redis, keys, QUEST)
    one = Notify(redis, keys, BoardCatalog(redis, keys))
    two = Notify(redis, keys, BoardCatalog(redis, keys))
    event = accepted(150)
    async with listening(redis, keys.user_channel("u-1")) as channel:
        await asyncio.gather(one([event]), two([event]))
        heard = await channel.drain()
    assert [m["reason"] for m in heard if m["type"] == "rank"] == ["entered_top"]
    assert [m for m in heard if m["type"] == "badge"] == [badge_message("bronze")]
    record = keys.idempotency("quest", event.event_id, event.user_id)
    assert await redis.getbit(record, NOTIFIER_BIT) == 1


class Counted:
    """A notifier's handler that counts the events it handled."""

    def __init__(self, notify: Notify, counts: list[int]) -> None:
        self._notify = notify
        self._counts = counts

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        await self._notify(events)
        self._counts.append(len(events))


async def test_two_notifiers_on_one_queue_push_a_message_published_twice_once(
    settings: LadderSettings,
    broker: Topology,
    channel: AbstractChannel,
    redis: Redis,
    keys: Keys,
) -> None:
    """The same, through the broker: two notifier runners compete on the queue, and each event
    is published to it twice (as a relay that died between the broker's confirm and removing
    its entries leaves it), so that each runner may take one copy at the same moment."""
    await add_board(redis, keys, QUEST)
    handled: list[int] = []
    runners = [
        ConsumerRunner(
            name="notifier",
            amqp_url=settings.amqp_url,
            topology=broker,
            handler=Counted(Notify(redis, keys, BoardCatalog(redis, keys)), handled),
            prefetch=1,
        )
        for _ in range(2)
    ]
    tasks = [asyncio.create_task(runner.run()) for runner in runners]
    told: list[int] = []
    try:
        async with asyncio.timeout(15.0):
            # Polling: the runner has no event for being ready.
            while not all(runner.ready for runner in runners):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        exchange = await channel.get_exchange(broker.scores_exchange)
        async with listening(redis, keys.user_channel("u-1")) as heard:
            for round_ in range(1, 11):
                body = message_body([accepted(50).model_dump_json()])
                for _ in range(2):
                    message = aio_pika.Message(body, message_id=uuid.uuid4().hex)
                    await exchange.publish(message, routing_key="")
                async with asyncio.timeout(15.0):
                    # Both copies handled.
                    while sum(handled) < 2 * round_:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                told.append(len([m for m in await heard.drain() if m["type"] == "rank"]))
    finally:
        for runner in runners:
            runner.stop()
        await asyncio.gather(*tasks)
    assert told == [1] * 10
