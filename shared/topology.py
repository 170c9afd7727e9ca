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
import re
import socket
from dataclasses import dataclass
from typing import Any, Literal

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

    @property
    def exchanges(self) -> tuple[str, ...]:
        """Every exchange :meth:`declare` makes."""
        return (self.scores_exchange, self.periods_exchange)

    @property
    def queues(self) -> tuple[str, ...]:
        """Every queue :meth:`declare` makes: each consumer's and its dead-letter queue."""
        return tuple(name for c in CONSUMERS for name in (self.queue(c), self.dead_queue(c)))

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
        for name in self.queues:
            await channel.queue_delete(name)
        for name in self.exchanges:
            await channel.exchange_delete(name)


# The broker's answer to a declaration that differs from what exists under that name:
# PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'ladder.scores.history' in
# vhost '/': received '30' but current is '20'
_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)'"
    r"[^:]*:\s*(?P<detail>.*)"
)
_NAMED = re.compile(r"(?P<kind>queue|exchange) '(?P<name>[^']+)'")
# The setting behind each argument Ladder declares from one.
SETTING_OF_ARGUMENT = {"x-delivery-limit": "LADDER_DELIVERY_LIMIT"}


@dataclass(frozen=True, slots=True)
class TopologyRefused:
    """The broker answers but refuses to declare Ladder's topology as it is configured
    (``PRECONDITION_FAILED``): a queue or exchange of that name exists with other arguments,
    typically a queue declared before ``LADDER_DELIVERY_LIMIT`` was changed. Not an outage:
    retrying changes nothing until the setting or the broker's queue is changed."""

    kind: str  # "queue", "exchange", or "" where the broker named neither
    name: str
    argument: str | None
    detail: str
    setting: str | None

    def describe(self) -> str:
        """One line for a log or ``/readyz``: what is refused, and what to change."""
        what = f"{self.kind} {self.name}" if self.kind else "a declaration"
        if self.argument is None:
            return f"the broker refuses {what}: {self.detail}"
        told = f"the broker refuses {what}: argument {self.argument} differs from the existing "
        told += f"{self.kind or 'one'}'s ({self.detail})"
        if self.setting is not None:
            told += (
                f"; {self.setting} must equal the value the {self.kind} was declared with,"
                f" or the {self.kind} be deleted to be declared again (docs/operations.md,"
                f" 'The broker refuses the topology')"
            )
        return told

    def fields(self) -> dict[str, Any]:
        """Structured log fields."""
        found: dict[str, Any] = {self.kind or "declaration": self.name, "refusal": self.detail}
        if self.argument is not None:
            found["argument"] = self.argument
        if self.setting is not None:
            found["setting"] = self.setting
        return found


def topology_refusal(error: BaseException) -> TopologyRefused | None:
    """What the broker refused of a declaration, if ``error`` (or what caused it) is its
    ``PRECONDITION_FAILED``; ``None`` for any other failure (an outage, say)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = " ".join(str(arg) for arg in getattr(current, "args", ()))
        if "PRECONDITION_FAILED" in text:
            text = text.split("PRECONDITION_FAILED", 1)[1].lstrip(" -")
            if found := _INEQUIVALENT.search(text):
                argument = found["argument"]
                return TopologyRefused(
                    found["kind"],
                    found["name"],
                    argument,
                    found["detail"].strip().rstrip('"'),
                    SETTING_OF_ARGUMENT.get(argument),
                )
            named = _NAMED.search(text)
            return TopologyRefused(
                named["kind"] if named else "",
                named["name"] if named else "",
                None,
                text.strip().rstrip('"'),
                None,
            )
        current = current.__cause__ or current.__context__
    return None
