"""The broker topology as data, and the one idempotent ``declare()`` that makes it real.

One durable fanout exchange, ``<prefix>.scores``, feeds a durable quorum queue per consumer
(``<prefix>.scores.aggregator``, ``.history``, ``.notifier``). Each queue has a delivery limit;
a message that reaches it, or that a consumer rejects as poison, is dead-lettered at least once
to that queue's own ``<queue>.dead``. ``<prefix>`` is ``LADDER_BROKER_PREFIX`` (``ladder``).

A second durable fanout exchange, ``<prefix>.periods``, carries one ``period.closed`` message per
closed period (docs/api.md section 8b). Ladder binds no queue to it: a game backend binds its
own (durable) queue to receive them; until one is bound the messages wait in Ladder's outbox.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Literal

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue
from pamqp.common import FieldTable

Consumer = Literal["aggregator", "history", "notifier"]
CONSUMERS: tuple[Consumer, ...] = ("aggregator", "history", "notifier")
Service = Literal["api", "aggregator", "history", "notifier", "sim"]


def _process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def connection_name(service: Service, role: str | None = None) -> str:
    """The name a Ladder AMQP connection gives itself: ``ladder-<service>``, its role in that
    service if it has several, then host and pid (``ladder-api relay web-1:4242``), so that the
    management UI's Connections and Channels pages tell the services and their processes
    apart. Pass it as :func:`client_properties`."""
    return " ".join(part for part in (f"ladder-{service}", role, _process()) if part)


def client_properties(service: Service, role: str | None = None) -> FieldTable:
    """``client_properties`` for ``aio_pika.connect_robust``: the connection's name."""
    return {"connection_name": connection_name(service, role)}


def consumer_tag(service: Service) -> str:
    """The consumer tag of a Ladder consumer (the Queues page's Consumers list shows it): its
    service, host and pid; unique as the broker needs it to be within a channel."""
    return f"ladder-{service}.{_process()}"


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str = "ladder"
    delivery_limit: int = 20

    @property
    def scores_exchange(self) -> str:
        return f"{self.prefix}.scores"

    @property
    def periods_exchange(self) -> str:
        return f"{self.prefix}.periods"

    def queue(self, consumer: Consumer) -> str:
        return f"{self.prefix}.scores.{consumer}"

    def dead_queue(self, consumer: Consumer) -> str:
        return f"{self.queue(consumer)}.dead"

    def queue_arguments(self, consumer: Consumer) -> FieldTable:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.dead_queue(consumer),
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    async def declare_exchange(self, channel: AbstractChannel) -> AbstractExchange:
        return await channel.declare_exchange(
            self.scores_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )

    async def declare_periods_exchange(self, channel: AbstractChannel) -> AbstractExchange:
        return await channel.declare_exchange(
            self.periods_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )

    async def declare(self, channel: AbstractChannel) -> dict[Consumer, AbstractQueue]:
        """Declare the exchange, every queue and its dead-letter queue; safe to repeat."""
        exchange = await self.declare_exchange(channel)
        await self.declare_periods_exchange(channel)
        queues: dict[Consumer, AbstractQueue] = {}
        for consumer in CONSUMERS:
            await channel.declare_queue(
                self.dead_queue(consumer), durable=True, arguments={"x-queue-type": "quorum"}
            )
            queue = await channel.declare_queue(
                self.queue(consumer), durable=True, arguments=self.queue_arguments(consumer)
            )
            await queue.bind(exchange)
            queues[consumer] = queue
        return queues

    async def delete(self, channel: AbstractChannel) -> None:
        """Remove everything :meth:`declare` made (tests and ``make clean``)."""
        for consumer in CONSUMERS:
            await channel.queue_delete(self.queue(consumer))
            await channel.queue_delete(self.dead_queue(consumer))
        await channel.exchange_delete(self.scores_exchange)
        await channel.exchange_delete(self.periods_exchange)
