"""How the consumer runner cuts the stream into batches (shared/consumer.py), through a real
broker: a pause ends a batch on the push path; off it, a batch takes its whole window."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from shared.amqp import connect as connect_broker
from shared.consumer import IDLE_GAP_SECONDS, ConsumerRunner
from shared.events import ScoreAccepted, message_body
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import accepted_event as accepted

WAIT = 15.0
# Between two messages: several times the idle gap, well inside the window.
SPACING = 0.03
WINDOW_MS = 2_000
MESSAGES = 4


@pytest.fixture
async def channel(settings: LadderSettings, broker: Topology) -> AsyncIterator[AbstractChannel]:
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        chan = await connection.channel(publisher_confirms=True)
        await broker.declare(chan)
        yield chan


class Batches:
    """The handler: the event ids of each batch it was handed."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        self._progress = asyncio.Condition()

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        async with self._progress:
            self.seen.append([e.event_id for e in events])
            self._progress.notify_all()

    async def wait_events(self, count: int) -> None:
        async with asyncio.timeout(WAIT), self._progress:
            await self._progress.wait_for(lambda: sum(map(len, self.seen)) >= count)


async def _batches_of_spaced_messages(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel, idle_gap: float | None
) -> list[list[str]]:
    handler = Batches()
    runner = ConsumerRunner(
        name="history",
        amqp_url=settings.amqp_url,
        topology=broker,
        handler=handler,
        flush_ms=WINDOW_MS,
        idle_gap=idle_gap,
    )
    task = asyncio.create_task(runner.run())
    try:
        # Consuming before the first publish, or the queue would hand them over together.
        async with asyncio.timeout(WAIT):
            # Polling: the runner has no event for being ready.
            while not runner.ready:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        exchange = await channel.get_exchange(broker.scores_exchange)
        for i in range(MESSAGES):
            body = message_body([accepted(f"e-{i}").model_dump_json()])
            message = aio_pika.Message(body, message_id=uuid.uuid4().hex)
            await exchange.publish(message, routing_key="")
            await asyncio.sleep(SPACING)
        await handler.wait_events(MESSAGES)
    finally:
        runner.stop()
        await asyncio.wait_for(task, WAIT)
    return handler.seen


async def test_on_the_push_path_a_pause_hands_each_message_over(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel
) -> None:
    seen = await _batches_of_spaced_messages(settings, broker, channel, IDLE_GAP_SECONDS)
    # Each message came after a pause longer than the gap: none waited for the next.
    assert seen == [[f"e-{i}"] for i in range(MESSAGES)]


async def test_off_the_push_path_a_batch_fills_its_window(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel
) -> None:
    seen = await _batches_of_spaced_messages(settings, broker, channel, None)
    # All came within the window of the first: one batch, one handler call.
    assert seen == [[f"e-{i}" for i in range(MESSAGES)]]
