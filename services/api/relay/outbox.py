"""The outbox relay: accepted events from Redis to the broker, confirmed, then removed.

Each board's outbox is a Redis stream read through the consumer group ``relay``; every API
process (every worker) is one consumer of it, so each entry goes to one of them. A read takes up
to ``IN_FLIGHT`` batches of ``LADDER_RELAY_BATCH`` entries; each batch becomes one persistent
message (see :mod:`shared.events`), all of them published at once with their publisher confirms
awaited together; only once the broker has confirmed every one are the entries acknowledged and
deleted, in one round trip. Under load the outbox fills between two reads and the messages fill
up: the broker, which tops out at a few thousand persistent messages a second to the three
quorum queues, sees a few hundred events in each. A read that could not be confirmed stays
pending for this consumer and is published again; entries left pending by a crashed process are
claimed by a live one after ``LADDER_RELAY_CLAIM_IDLE_MS``. Consumers are idempotent on
``event_id``, so a batch published twice has one effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any, cast

import aio_pika
import structlog
from aio_pika.abc import AbstractExchange, AbstractRobustConnection
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from shared.boards import BoardCatalog
from shared.events import message_body
from shared.keys import OUTBOX_GROUP, Keys
from shared.settings import LadderSettings
from shared.topology import Topology

log = structlog.get_logger(__name__)

RELAYED = Counter("ladder_relay_events_total", "Events confirmed by the broker")
MESSAGES = Counter("ladder_relay_messages_total", "Messages confirmed by the broker")
FAILURES = Counter("ladder_relay_failures_total", "Batches the broker did not confirm")
BACKLOG = Gauge("ladder_relay_backlog", "Entries in the outbox at the last look", ["board_id"])

_BOARDS_REFRESH_SECONDS = 2.0
_CLAIM_EVERY_SECONDS = 5.0
# Messages awaiting their confirms at once, a read.
IN_FLIGHT = 8


class Relay:
    def __init__(
        self, redis: Redis, keys: Keys, catalog: BoardCatalog, settings: LadderSettings
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._settings = settings
        self._topology = Topology(settings.broker_prefix, settings.delivery_limit)
        self._consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._connection: AbstractRobustConnection | None = None
        self._exchange: AbstractExchange | None = None
        self._groups: set[str] = set()
        # Streams known to hold no entry pending for this consumer (read, not yet confirmed).
        self._settled: set[str] = set()
        self._written: set[str] = set()

    @property
    def ready(self) -> bool:
        return (
            self._connection is not None
            and not self._connection.is_closed
            and self._exchange is not None
        )

    def wake(self, board_id: str) -> None:
        """Called after a write: relay now rather than at the next poll (and know the board,
        should it be newer than the last look at the catalog)."""
        self._written.add(board_id)
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Relay until :meth:`stop`, reconnecting to the broker as long as it takes."""
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                await self._connect()
                backoff = 0.5
                await self._pump()
            except RedisError as exc:
                log.warning("redis unavailable to the relay", error=repr(exc))
            except Exception as exc:
                # Whatever the broker client raised, the outbox keeps the events.
                log.warning("broker unavailable; outbox holds events", error=repr(exc))
            finally:
                await self._disconnect()
            if not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
                backoff = min(backoff * 2, 5.0)

    async def _connect(self) -> None:
        self._connection = await aio_pika.connect_robust(
            self._settings.amqp_url, reconnect_interval=1.0
        )
        channel = await self._connection.channel(publisher_confirms=True)
        self._settled.clear()
        await self._topology.declare(channel)
        self._exchange = await self._topology.declare_exchange(channel)
        log.info("relay connected", exchange=self._topology.scores_exchange)

    async def _disconnect(self) -> None:
        self._exchange = None
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        boards: list[str] = []
        boards_at = claim_at = 0.0
        while not self._stopping.is_set():
            now = loop.time()
            if now >= boards_at:
                boards = [b.board_id for b in await self._catalog.all()]
                boards_at = now + _BOARDS_REFRESH_SECONDS
            if not self._written.issubset(boards):
                boards = sorted({*boards, *self._written})
            self._written.clear()
            claim = now >= claim_at
            if claim:
                claim_at = now + _CLAIM_EVERY_SECONDS
            moved = 0
            for board_id in boards:
                moved += await self._relay_board(board_id, claim)
            if moved == 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.25)
        # Drain what is already in the outbox before going, within the grace period.
        for board_id in boards:
            while await self._relay_board(board_id, False):
                pass

    async def _ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        try:
            await self._redis.xgroup_create(stream, OUTBOX_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(stream)

    async def _relay_board(self, board_id: str, claim: bool) -> int:
        stream = self._keys.outbox(board_id)
        await self._ensure_group(stream)
        if claim:
            claimed = await self._redis.xautoclaim(
                stream,
                OUTBOX_GROUP,
                self._consumer,
                min_idle_time=self._settings.relay_claim_idle_ms,
                start_id="0-0",
                count=self._settings.relay_batch,
            )
            if claimed and claimed[1]:
                self._settled.discard(stream)
        # Our own pending entries first (a read not yet confirmed), then new ones.
        for start in (">",) if stream in self._settled else ("0", ">"):
            try:
                reply = await self._redis.xreadgroup(
                    OUTBOX_GROUP,
                    self._consumer,
                    {stream: start},
                    count=self._settings.relay_batch * IN_FLIGHT,
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                # The stream went away (its board was deleted): make the group again next time.
                self._groups.discard(stream)
                return 0
            replies = cast(list[Any], reply)
            read: list[tuple[str, dict[str, str] | None]] = replies[0][1] if replies else []
            entries = [(eid, fields) for eid, fields in read if fields]
            if entries:
                self._settled.discard(stream)
                await self._publish(board_id, stream, entries)
                if start == ">":
                    # Nothing was pending before this read, and this read is confirmed now.
                    self._settled.add(stream)
                return len(entries)
            if start == "0":
                self._settled.add(stream)
        BACKLOG.labels(board_id).set(0)
        return 0

    async def _publish(
        self, board_id: str, stream: str, entries: list[tuple[str, dict[str, str]]]
    ) -> None:
        exchange = self._exchange
        if exchange is None:
            raise aio_pika.exceptions.AMQPConnectionError("no channel")
        ids = [eid for eid, _ in entries]
        size = self._settings.relay_batch
        batches = [entries[i : i + size] for i in range(0, len(entries), size)]
        try:
            # Every message of the read in flight at once; each publish returns on its confirm.
            async with asyncio.TaskGroup() as group:
                for batch in batches:
                    message = aio_pika.Message(
                        message_body([fields["e"] for _, fields in batch]),
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        message_id=f"{board_id}:{batch[0][0]}:{batch[-1][0]}",
                        type="score.accepted",
                    )
                    group.create_task(exchange.publish(message, routing_key="", timeout=10))
        except BaseExceptionGroup as group_error:
            FAILURES.inc()
            raise group_error.exceptions[0] from group_error
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xack(stream, OUTBOX_GROUP, *ids)
            pipe.xdel(stream, *ids)
            pipe.xlen(stream)
            _, _, backlog = await pipe.execute()
        BACKLOG.labels(board_id).set(backlog)
        RELAYED.inc(len(ids))
        MESSAGES.inc(len(batches))
