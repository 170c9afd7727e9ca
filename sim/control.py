"""Live control of running simulations over RabbitMQ.

``<broker prefix>.control`` (``ladder.control`` by default, ``LADDER_BROKER_PREFIX``) is a
fanout exchange. Each running simulation binds its own exclusive, auto-deleted queue to it, so a
change published once reaches every simulation running at that moment and none that start later.
The exchange is auto-deleted too: it exists while a simulation runs, and goes with the last one
(an exchange of that name that exists already, durable or not, is used as it is).
A message is JSON, ``{"name": "robot_share", "value": 1.0}``, checked by the publisher and again
by each simulation before it applies it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aio_pika
import orjson
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from aio_pika.exceptions import PublishError

from shared import amqp
from shared.topology import client_properties, consumer_tag
from sim.params import parse_value

log = structlog.get_logger("sim.control")


class NobodyListening(RuntimeError):
    """The change reached the exchange, but no simulation is bound to it."""


def exchange_name(broker_prefix: str) -> str:
    return f"{broker_prefix}.control"


async def declare_exchange(
    channel: AbstractChannel, broker_prefix: str, *, passive: bool = False
) -> AbstractExchange:
    return await channel.declare_exchange(
        exchange_name(broker_prefix),
        aio_pika.ExchangeType.FANOUT,
        durable=False,
        auto_delete=True,
        passive=passive,
    )


async def publish(amqp_url: str, broker_prefix: str, name: str, value: Any) -> Any:
    """Check ``value`` for parameter ``name`` and publish it with a publisher confirm; returns the
    value as sent. Raises :class:`NobodyListening` when no simulation runs to take it."""
    parsed = parse_value(name, value)
    connection = await amqp.connect(amqp_url.split(","))
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        nobody = NobodyListening(f"no simulation listens on {exchange_name(broker_prefix)}")
        try:
            # Passive: a running simulation made the exchange; sim.set never makes one.
            exchange = await declare_exchange(channel, broker_prefix, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            raise nobody from None
        message = aio_pika.Message(
            orjson.dumps({"name": name, "value": parsed}),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT,
        )
        try:
            await exchange.publish(message, routing_key="", mandatory=True)
        except PublishError as exc:
            raise nobody from exc
    return parsed


class Listener:
    """Consumes changes from the control exchange and hands each to ``apply``; reconnects by
    itself (``connect_robust``) and, when the broker is away at start, keeps trying."""

    def __init__(
        self, amqp_url: str, broker_prefix: str, apply: Callable[[str, Any], None]
    ) -> None:
        self.amqp_url = amqp_url
        self.broker_prefix = broker_prefix
        self.apply = apply
        self.bound = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                await self._consume()
                return
            except (OSError, aio_pika.exceptions.AMQPError) as exc:
                log.warning("control exchange unreachable", error=str(exc), retry_in=delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                delay = min(delay * 2, 10.0)

    async def _consume(self) -> None:
        connection = await amqp.connect_robust(
            self.amqp_url.split(","), client_properties=client_properties("sim", "control")
        )
        async with connection:
            channel = await connection.channel()
            try:
                # One that exists already is used as it is, whatever it was declared with (a
                # durable one made by an operator, say): declaring it again with other arguments
                # would be refused.
                exchange = await declare_exchange(channel, self.broker_prefix, passive=True)
            except aio_pika.exceptions.ChannelNotFoundEntity:
                channel = await connection.channel()  # the broker closed the one that asked
                exchange = await declare_exchange(channel, self.broker_prefix)
            queue = await channel.declare_queue(exclusive=True, auto_delete=True)
            await queue.bind(exchange)
            tag = await queue.consume(self._on_message, consumer_tag=consumer_tag("sim"))
            self.bound.set()
            log.info("listening for changes", exchange=exchange.name)
            try:
                await self._stop.wait()
            finally:
                with contextlib.suppress(Exception):
                    await queue.cancel(tag)

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with message.process():
            try:
                body = orjson.loads(message.body)
                name, value = body["name"], body["value"]
                if not isinstance(name, str):
                    raise TypeError("name must be a string")
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("control message ignored", error=str(exc))
                return
            try:
                self.apply(name, value)
            except ValueError as exc:
                log.warning("change refused", name=name, value=value, error=str(exc))
