"""How the consumer runner cuts the stream into batches (shared/consumer.py), through a real
broker: a pause ends a batch on the push path; off it, a batch takes its whole window."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from shared.consumer import IDLE_GAP_SECONDS, ConsumerRunner
from shared.events import ScoreAccepted, message_body
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import accepted_event as accepted
from tests.helpers import consuming as runner_consuming

WAIT = 15.0
# Between two messages: ten times the push path's gap, well inside the window.
SPACING = 0.03
WINDOW_MS = 2_000
MESSAGES = 4


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


@contextlib.asynccontextmanager
async def consuming(
    settings: LadderSettings, broker: Topology, idle_gap: float | None
) -> AsyncIterator[Batches]:
    """A runner with a long window and ``idle_gap``, consuming before the test publishes (else
    the queue would hand what was published before together)."""
    handler = Batches()
    runner = ConsumerRunner(
        name="history",
        amqp_url=settings.amqp_url,
        topology=broker,
        handler=handler,
        flush_ms=WINDOW_MS,
        idle_gap=idle_gap,
    )
    async with runner_consuming(runner, WAIT):
        yield handler


async def publish(channel: AbstractChannel, broker: Topology, event_id: str) -> None:
    exchange = await channel.get_exchange(broker.scores_exchange)
    body = message_body([accepted(event_id).model_dump_json()])
    await exchange.publish(aio_pika.Message(body, message_id=uuid.uuid4().hex), routing_key="")


@pytest.mark.timing
async def test_on_the_push_path_a_lone_message_is_handed_over_at_once(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel
) -> None:
    async with consuming(settings, broker, IDLE_GAP_SECONDS) as handler:
        for i in range(MESSAGES):
            started = time.monotonic()
            await publish(channel, broker, f"e-{i}")
            await handler.wait_events(i + 1)
            # Handed over after the pause that followed it, not at the end of the window.
            assert time.monotonic() - started < WINDOW_MS / 1000 / 2
    assert handler.seen == [[f"e-{i}"] for i in range(MESSAGES)]


async def test_off_the_push_path_a_batch_fills_its_window(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel
) -> None:
    async with consuming(settings, broker, None) as handler:
        for i in range(MESSAGES):
            await publish(channel, broker, f"e-{i}")
            # Pauses of ten times the push path's gap, all within the window of the first.
            await asyncio.sleep(SPACING)
        await handler.wait_events(MESSAGES)
    # One batch, one handler call.
    assert handler.seen == [[f"e-{i}" for i in range(MESSAGES)]]
