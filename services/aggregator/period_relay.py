"""The period outbox relay: ``period.closed`` messages from Redis to ``ladder.periods``.

The close (services/aggregator/closer.py) appends each message to the board's period outbox in
the same atomic step as its claim. Every aggregator process is a consumer of the outbox's group
``relay``: each entry goes to one of them, is published persistent and mandatory with its
publisher confirm awaited, and only then acknowledged and deleted. A broker that is down, or
that routes the message to no queue (nobody has bound one to ``ladder.periods`` yet), leaves the
entry where it is, to be published again; an entry left pending by a process that died is
claimed by another after ``LADDER_RELAY_CLAIM_IDLE_MS``. Only a process that dies between the
broker's confirm and the acknowledgement publishes a message twice: the copies carry the same
``message_id`` (``<board>:<period>:<period_id>``), by which a consumer can tell them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any, cast

import aio_pika
import orjson
import structlog
from aio_pika.abc import AbstractExchange, AbstractRobustConnection
from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared import amqp
from shared.boards import BoardCatalog
from shared.keys import OUTBOX_GROUP, Keys
from shared.redis import ensure_group
from shared.settings import LadderSettings
from shared.topology import Topology, client_properties

log = structlog.get_logger(__name__)

PUBLISHED = Counter("ladder_periods_published_total", "period.closed messages confirmed")
FAILURES = Counter("ladder_periods_publish_failures_total", "period.closed publishes refused")

POLL_SECONDS = 0.5
CLAIM_EVERY_SECONDS = 5.0
READ = 50


def message_id(body: str) -> str:
    fields = orjson.loads(body)
    return f"{fields['board_id']}:{fields['period']}:{fields['period_id']}"


class PeriodRelay:
    def __init__(
        self, redis: Redis, keys: Keys, catalog: BoardCatalog, settings: LadderSettings
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._settings = settings
        self._topology = Topology(settings.broker_prefix, settings.delivery_limit)
        self._consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._connection: AbstractRobustConnection | None = None
        self._exchange: AbstractExchange | None = None
        self._groups: set[str] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop``, reconnecting to the broker as long as it takes."""
        backoff = 0.5
        while not stop.is_set():
            try:
                await self._connect()
                backoff = 0.5
                await self._pump(stop)
            except Exception as exc:
                log.warning(
                    "period relay: broker or redis unavailable; outbox holds messages",
                    error=repr(exc),
                )
            finally:
                await self._disconnect()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, 5.0)

    async def _connect(self) -> None:
        self._connection = await amqp.connect_robust(
            self._settings.amqp_urls,
            reconnect_interval=1.0,
            client_properties=client_properties("aggregator", "period-relay"),
        )
        # A message routed to no queue comes back: publish raises, and the entry waits.
        channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await self._topology.declare_periods_exchange(channel)

    async def _disconnect(self) -> None:
        self._exchange = None
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None

    async def _pump(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        claim_at = 0.0
        while not stop.is_set():
            claim = loop.time() >= claim_at
            if claim:
                claim_at = loop.time() + CLAIM_EVERY_SECONDS
            for board in await self._catalog.all():
                await self.relay_board(board.board_id, claim)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_SECONDS)

    async def _ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        await ensure_group(self._redis, stream, OUTBOX_GROUP)
        self._groups.add(stream)

    async def relay_board(self, board_id: str, claim: bool) -> int:
        """Publish the board's waiting messages (ours pending first); how many were confirmed."""
        stream = self._keys.periods_outbox(board_id)
        await self._ensure_group(stream)
        if claim:
            await self._redis.xautoclaim(
                stream,
                OUTBOX_GROUP,
                self._consumer,
                min_idle_time=self._settings.relay_claim_idle_ms,
                start_id="0-0",
                count=READ,
            )
        done = 0
        for start in ("0", ">"):
            try:
                reply = await self._redis.xreadgroup(
                    OUTBOX_GROUP, self._consumer, {stream: start}, count=READ
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._groups.discard(stream)
                return done
            replies = cast(list[Any], reply)
            for entry_id, fields in replies[0][1] if replies else []:
                if fields and fields.get("m"):
                    try:
                        await self._publish(fields["m"])
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        log.error("period outbox entry is no message; dropped", entry=entry_id)
                    except aio_pika.exceptions.DeliveryError:
                        # Routed to no queue: it waits (pending) for a queue to be bound.
                        log.info("period.closed routed to no queue; it waits", board_id=board_id)
                        return done
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.xack(stream, OUTBOX_GROUP, entry_id)
                    pipe.xdel(stream, entry_id)
                    await pipe.execute()
                done += 1
        return done

    async def _publish(self, body: str) -> None:
        exchange = self._exchange
        if exchange is None:
            raise aio_pika.exceptions.AMQPConnectionError("no channel")
        message = aio_pika.Message(
            body.encode(),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=message_id(body),
            type="period.closed",
        )
        try:
            # Mandatory: a message no queue takes comes back, and waits in the outbox.
            await exchange.publish(message, routing_key="", mandatory=True, timeout=10)
        except Exception:
            FAILURES.inc()
            raise
        PUBLISHED.inc()
