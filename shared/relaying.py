"""What Ladder's two relays share: Redis streams read through one consumer group, published to
RabbitMQ with confirms.

The API's outbox relay (services/api/relay/outbox.py) takes accepted events to ``ladder.scores``;
the aggregator's period relay (services/aggregator/period_relay.py) takes ``period.closed``
messages to ``ladder.periods``. Both read a stream a board through the group ``relay``, each
process one consumer of it, so each entry goes to one process; both acknowledge and delete an
entry only once the broker has confirmed its message, and publish it mandatory, so that one no
queue takes comes back and waits in the stream. What is left here is the rest they have in
common: the broker connection kept and made again with backoff, the group made where it is
missing, entries left pending by a dead process claimed, and a stream's entries read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, cast

import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from shared import amqp
from shared.boards import BoardCatalog
from shared.keys import OUTBOX_GROUP, Keys
from shared.redis import ensure_group
from shared.settings import LadderSettings
from shared.topology import Service, Topology, client_properties

log = structlog.get_logger(__name__)

Entry = tuple[str, dict[str, str]]
"""A stream entry: its id and its fields."""

# A sweep (``_holding`` over the boards of ``_next_sweep``) asks about this many boards' streams
# at most; the next sweep goes on from where it stopped. An idle relay then costs the same
# however many boards are defined, and what a sweep alone finds (entries another process wrote
# and left) waits longer where there are more boards: len(boards) / SWEEP_MOST sweeps at most.
# The claim of entries a dead process left pending asks about every board, in pipelines of this
# many (the event loop is held one pipeline at a time), every few seconds.
SWEEP_MOST = 250


class StreamRelay(ABC):
    """A relay's connection and stream reads; a subclass declares what it publishes to
    (:meth:`_declare`) and moves the entries (:meth:`_pump`)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        catalog: BoardCatalog,
        settings: LadderSettings,
        owner: tuple[Service, str],
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._settings = settings
        self._owner = owner
        self._topology = Topology(settings.broker_prefix, settings.delivery_limit)
        self._consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._connection: AbstractRobustConnection | None = None
        self._exchange: AbstractExchange | None = None
        self._groups: set[str] = set()
        # Where the next sweep starts among the boards, by id (``_next_sweep``).
        self._sweep_from = 0

    async def relay_until(self, stop: asyncio.Event) -> None:
        """Relay until ``stop``, connecting to the broker again as long as it takes. Whatever
        fails, the streams keep what they hold."""
        backoff, name = 0.5, self._owner[1]
        while not stop.is_set():
            try:
                await self._connect()
                backoff = 0.5
                await self._pump(stop)
            except RedisError as exc:
                log.warning("redis unavailable to the relay", relay=name, error=repr(exc))
            except Exception as exc:
                # Whatever the broker client raised.
                log.warning("broker unavailable; the outbox holds", relay=name, error=repr(exc))
            finally:
                await self._disconnect()
            if not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 5.0)

    @abstractmethod
    async def _declare(self, channel: AbstractChannel) -> AbstractExchange:
        """The exchange to publish to, declared on a new connection's channel."""

    @abstractmethod
    async def _pump(self, stop: asyncio.Event) -> None:
        """Move entries until ``stop``; returns or raises when the broker or Redis fails."""

    async def _connect(self) -> None:
        connection = await amqp.connect_robust(
            self._settings.amqp_urls,
            reconnect_interval=1.0,
            client_properties=client_properties(*self._owner),
        )
        self._connection = connection
        # A message routed to no queue comes back: its publish raises, and its entry waits.
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        self._exchange = await self._declare(channel)
        log.info(
            "relay connected",
            relay=self._owner[1],
            exchange=self._exchange.name,
            node=connection.node,
        )

    async def _disconnect(self) -> None:
        self._exchange = None
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None

    def _next_sweep(self, boards: list[str]) -> list[str]:
        """The boards (sorted by id) a sweep asks about: all of them where there are at most
        ``SWEEP_MOST``, else the next ``SWEEP_MOST`` in turn from where the last sweep stopped
        (a board defined or deleted meanwhile shifts the turn by one, at most a sweep late)."""
        if len(boards) <= SWEEP_MOST:
            return boards
        start = self._sweep_from % len(boards)
        self._sweep_from = start + SWEEP_MOST
        return (boards[start:] + boards[:start])[:SWEEP_MOST]

    async def _holding(self, boards: list[str], stream_of: Callable[[str], str]) -> set[str]:
        """Those of ``boards`` whose stream (``stream_of(board_id)``) holds entries, read or
        not (an entry stays until its message is confirmed): one pipelined ``XLEN`` for every
        ``SWEEP_MOST`` of them, so that a pass over many idle boards costs a round trip for
        each ``SWEEP_MOST``, not a read each."""
        found: set[str] = set()
        for at in range(0, len(boards), SWEEP_MOST):
            chunk = boards[at : at + SWEEP_MOST]
            async with self._redis.pipeline(transaction=False) as pipe:
                for board_id in chunk:
                    pipe.xlen(stream_of(board_id))
                lengths = await pipe.execute()
            found.update(board_id for board_id, n in zip(chunk, lengths, strict=True) if n)
        return found

    async def _claim(self, stream: str, count: int) -> bool:
        """Take over up to ``count`` entries another consumer left pending longer than
        ``LADDER_RELAY_CLAIM_IDLE_MS`` (a process that died); whether there were any."""
        await self._ensure_group(stream)
        claimed = await self._redis.xautoclaim(
            stream,
            OUTBOX_GROUP,
            self._consumer,
            min_idle_time=self._settings.relay_claim_idle_ms,
            start_id="0-0",
            count=count,
        )
        return bool(claimed and claimed[1])

    async def _read(self, stream: str, start: str, count: int) -> list[Entry] | None:
        """Up to ``count`` entries: from ``"0"`` this consumer's pending ones (read before, not
        yet confirmed), from ``">"`` new ones. An entry deleted while pending comes back without
        its fields: it is acknowledged, which ends its pendency, and left out. ``None`` if the
        stream has no group (its board was deleted, or Redis lost it): the next read makes it
        again."""
        await self._ensure_group(stream)
        try:
            reply = await self._redis.xreadgroup(
                OUTBOX_GROUP, self._consumer, {stream: start}, count=count
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._groups.discard(stream)
            return None
        replies = cast(list[Any], reply)
        read: list[tuple[str, dict[str, str] | None]] = replies[0][1] if replies else []
        gone = [entry_id for entry_id, fields in read if not fields]
        if gone:
            await self._redis.xack(stream, OUTBOX_GROUP, *gone)
        return [(entry_id, fields) for entry_id, fields in read if fields]

    async def _ensure_group(self, stream: str) -> None:
        if stream in self._groups:
            return
        await ensure_group(self._redis, stream, OUTBOX_GROUP)
        self._groups.add(stream)
