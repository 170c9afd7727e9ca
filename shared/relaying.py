"""What Ladder's two relays share: Redis streams read through one consumer group, published to
RabbitMQ with confirms.

The API's outbox relay (services/api/relay/outbox.py) takes accepted events to ``ladder.scores``;
the aggregator's period relay (services/aggregator/period_relay.py) takes ``period.closed``
messages to ``ladder.periods``. Both read a stream a board through the group ``relay``, each
process one consumer of it, so each entry goes to one process; both acknowledge and delete an
entry only once the broker has confirmed its message, and publish it mandatory, so that one no
queue takes comes back and waits in the stream. What is left here is the rest they have in
common: the broker connection kept and made again with backoff, the group made where it is
missing and again wherever it went away (a board deleted and made again: one board's lost
group holds back no other board), entries left pending by a dead process claimed, and a
stream's entries read.

And the groups' consumers: each relay process is one, named after its host and process id, in
every group it reads, until deleted, so each start of a process would add one to each board's
groups for good. A relay stopped gracefully deletes its own where it has nothing pending
(:meth:`StreamRelay._leave`); a claim, and a relay's first use of a group, delete those with
nothing pending idle ``FORGET_IDLE_CLAIMS`` claim thresholds. One holding entries stays.

And what they show of it (:class:`RelayMetrics`), the broker away or not: whether the relay is
connected, each failed connection attempt and each publish that failed, and each board's
stream length, read on every pass while connected and on every retry while the broker is away
(when nothing is published, the streams only grow). A broker that answers but refuses the
topology as configured (``PRECONDITION_FAILED``: a queue declared with another
``x-delivery-limit``) is logged as the configuration error it is, naming the queue, the
argument and the setting (:func:`shared.topology.topology_refusal`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from shared import amqp
from shared.boards import BoardCatalog
from shared.failures import short_reason
from shared.keys import OUTBOX_GROUP, Keys
from shared.redis import ensure_group, forget_consumers
from shared.settings import LadderSettings
from shared.topology import Service, Topology, client_properties, topology_refusal

log = structlog.get_logger(__name__)

Entry = tuple[str, dict[str, str]]
"""A stream entry: its id and its fields."""

# A sweep (``_lengths`` over the boards of ``_next_sweep``) asks about this many boards' streams
# at most; the next sweep goes on from where it stopped. An idle relay then costs the same
# however many boards are defined, and what a sweep alone finds (entries another process wrote
# and left) waits longer where there are more boards: len(boards) / SWEEP_MOST sweeps at most.
# The claim of entries a dead process left pending asks about every board, in pipelines of this
# many (the event loop is held one pipeline at a time), every few seconds.
SWEEP_MOST = 250
# A consumer with no entry pending is forgotten once idle this many times
# LADDER_RELAY_CLAIM_IDLE_MS (5 minutes by default): a dead relay's entries are claimed after
# one, so by twenty its consumer is empty and long dead. Idle is the time since the consumer was
# last given entries: a live relay's given none of a board for that long may go too, holding
# nothing (looked at in the step that deletes it), and its next read makes it again.
FORGET_IDLE_CLAIMS = 20


@dataclass(frozen=True, slots=True)
class RelayMetrics:
    """What a relay shows of itself: ``connected`` (1 while connected to the broker, else 0),
    ``failures`` (labelled ``stage``: ``connect`` for a connection attempt that failed, the
    topology refused included; ``publish`` for a publish that failed) and ``backlog`` (labelled
    ``board_id``: the board's stream length at the last look)."""

    connected: Gauge
    failures: Counter
    backlog: Gauge


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
        metrics: RelayMetrics,
        stream_of: Callable[[str], str],
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._settings = settings
        self._owner = owner
        self._metrics = metrics
        # A board's stream, by its id.
        self._stream_of = stream_of
        self._topology = Topology(settings.broker_prefix, settings.delivery_limit)
        self._consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._connection: AbstractRobustConnection | None = None
        self._exchange: AbstractExchange | None = None
        # The streams whose group this relay made, or found made, since it connected.
        self._groups: set[str] = set()
        # The streams whose group this relay's consumer is in: read or claimed since it started.
        self._joined: set[str] = set()
        self._forget_ms = FORGET_IDLE_CLAIMS * settings.relay_claim_idle_ms
        # Where the next sweep starts among the boards, by id (``_next_sweep``).
        self._sweep_from = 0
        # Boards whose backlog gauge was last set above 0.
        self._gauged: set[str] = set()
        self.last_error: str | None = None
        """Why the last connection failed or was lost (a short line, no address), for
        ``/readyz``; ``None`` once connected."""

    @property
    def ready(self) -> bool:
        """Connected now: a robust connection that is reconnecting is not ready."""
        return (
            self._connection is not None
            and not self._connection.is_closed
            and self._connection.connected.is_set()
            and self._exchange is not None
        )

    async def relay_until(self, stop: asyncio.Event) -> None:
        """Relay until ``stop``, connecting to the broker again as long as it takes, then leave
        the groups (:meth:`_leave`). Whatever fails, the streams keep what they hold, and the
        backlog gauge follows their length."""
        backoff, name = 0.5, self._owner[1]
        while not stop.is_set():
            connected = False
            try:
                await self._connect()
                connected = True
                self._metrics.connected.set(1)
                self.last_error = None
                backoff = 0.5
                # Whatever failed before may have taken groups with it (Redis lost its data, a
                # board's keys were unlinked): a pump takes none on trust, it makes each again.
                self._groups.clear()
                await self._pump(stop)
            except RedisError as exc:
                self.last_error = f"redis: {short_reason(exc)}"
                log.warning("redis unavailable to the relay", relay=name, error=repr(exc))
            except Exception as exc:
                # Whatever the broker client raised.
                if not connected:
                    self._metrics.failures.labels("connect").inc()
                refused = topology_refusal(exc)
                if refused is not None:
                    self.last_error = refused.describe()
                    log.error(
                        "broker refuses the topology: configuration error; the outbox holds",
                        relay=name,
                        reason=self.last_error,
                        **refused.fields(),
                    )
                else:
                    self.last_error = short_reason(exc)
                    log.warning("broker unavailable; the outbox holds", relay=name, error=repr(exc))
            finally:
                self._metrics.connected.set(0)
                await self._disconnect()
            if not stop.is_set():
                # Nothing is published meanwhile: the streams' length is what the gauge shows.
                await self._gauge_streams()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 5.0)
        await self._leave()

    async def _leave(self) -> None:
        """This relay's consumer deleted from each group it joined, where it has no entry pending
        (every read confirmed before it stopped); one holding entries stays, for another relay
        to claim them and forget it later, as does every one while Redis is away."""
        streams, left = sorted(self._joined), 0
        try:
            for at in range(0, len(streams), SWEEP_MOST):
                chunk = streams[at : at + SWEEP_MOST]
                left += await forget_consumers(self._redis, chunk, OUTBOX_GROUP, 0, self._consumer)
        except RedisError as exc:
            log.warning("relay left no group", relay=self._owner[1], error=repr(exc))
            return
        log.info(
            "relay left its consumer groups", relay=self._owner[1], left=left, groups=len(streams)
        )

    def _note_connection(self) -> None:
        """Set the connected gauge from the connection's state (a pass of the pump calls it:
        a robust connection reconnects by itself, without the pump raising)."""
        self._metrics.connected.set(1 if self.ready else 0)

    async def _gauge_streams(self) -> None:
        """Every board's stream length into the backlog gauge: one pipelined ``XLEN`` for each
        ``SWEEP_MOST`` boards. Redis away too: the gauge keeps its last value."""
        try:
            boards = [board.board_id for board in await self._catalog.all()]
            self._forget_gone(boards)
            self._set_backlog(boards, await self._lengths(boards))
        except Exception as exc:
            log.debug("stream lengths not read", relay=self._owner[1], error=repr(exc))

    def _set_backlog(self, boards: list[str], lengths: dict[str, int]) -> None:
        """The backlog gauge of each of ``boards``: its length in ``lengths``, 0 if absent (set
        only where it changes from or to 0: an idle board costs nothing)."""
        for board_id in boards:
            length = lengths.get(board_id, 0)
            if length:
                self._metrics.backlog.labels(board_id).set(length)
                self._gauged.add(board_id)
            elif board_id in self._gauged:
                self._emptied(board_id)
                self._gauged.discard(board_id)

    def _forget_gone(self, boards: list[str]) -> None:
        """What is kept of the boards no longer among ``boards`` (every board defined) forgotten:
        their gauges set to 0 (a board deleted takes its stream with it, and no later look would
        find it to say so), and the groups made or joined on their streams."""
        for board_id in self._gauged.difference(boards):
            self._emptied(board_id)
            self._gauged.discard(board_id)
        defined = {self._stream_of(board_id) for board_id in boards}
        self._groups &= defined
        self._joined &= defined

    def _emptied(self, board_id: str) -> None:
        """A board's stream found empty after it held entries: its gauges go to 0."""
        self._metrics.backlog.labels(board_id).set(0)

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

    async def _lengths(self, boards: list[str]) -> dict[str, int]:
        """The length of each of ``boards``' streams that holds entries, read or not (an entry
        stays until its message is confirmed): one pipelined ``XLEN`` for every ``SWEEP_MOST``
        of them, so that a pass over many idle boards costs a round trip for each
        ``SWEEP_MOST``, not a read each."""
        found: dict[str, int] = {}
        for at in range(0, len(boards), SWEEP_MOST):
            chunk = boards[at : at + SWEEP_MOST]
            async with self._redis.pipeline(transaction=False) as pipe:
                for board_id in chunk:
                    pipe.xlen(self._stream_of(board_id))
                lengths = await pipe.execute()
            found.update((b, int(n)) for b, n in zip(chunk, lengths, strict=True) if n)
        return found

    async def _claim(self, stream: str, count: int) -> bool:
        """Take over every entry other consumers left pending longer than
        ``LADDER_RELAY_CLAIM_IDLE_MS`` (processes that died); whether there were any. Up to
        ``count`` an ``XAUTOCLAIM``, each going on where the last stopped until the group's
        pending list is gone through: one claim takes all a dead relay read (several reads'
        worth where several died), which this relay then reads as its own pending entries (the
        outbox relay a read at a time, before any new one: they go out in the stream's order),
        not seconds later at the next claims. Then the consumers long idle with nothing pending,
        the dead ones just emptied among them, are forgotten (:meth:`_forget_idle`)."""
        claimed, cursor = False, "0-0"
        while True:
            reply = await self._grouped(
                stream,
                functools.partial(
                    self._redis.xautoclaim,
                    stream,
                    OUTBOX_GROUP,
                    self._consumer,
                    min_idle_time=self._settings.relay_claim_idle_ms,
                    start_id=cursor,
                    count=count,
                ),
            )
            if not reply:
                return claimed  # the stream is gone
            claimed = claimed or bool(reply[1])
            # The next call's start; 0-0 once the whole pending list was gone through.
            cursor = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            if cursor == "0-0":
                await self._forget_idle(stream)
                return claimed

    async def _forget_idle(self, stream: str) -> None:
        """The consumers of ``stream``'s group idle ``FORGET_IDLE_CLAIMS`` claim thresholds with
        nothing pending deleted: stopped or dead processes' (the module's docstring). Refused
        (a process of the version before loaded its library, which lacks the function), the
        consumers stay and the relay goes on: it needs none of this to relay."""
        try:
            forgotten = await forget_consumers(self._redis, [stream], OUTBOX_GROUP, self._forget_ms)
        except ResponseError as exc:
            log.debug("idle consumers not forgotten", relay=self._owner[1], error=repr(exc))
            return
        if forgotten:
            log.info(
                "idle consumers forgotten", relay=self._owner[1], stream=stream, forgotten=forgotten
            )

    async def _read(self, stream: str, start: str, count: int) -> list[Entry] | None:
        """Up to ``count`` entries: from ``"0"`` this consumer's pending ones (read before, not
        yet confirmed), from ``">"`` new ones. An entry deleted while pending comes back without
        its fields: it is acknowledged, which ends its pendency, and left out. ``None`` if the
        stream is gone (its board was deleted) or has no group (:meth:`_grouped`)."""
        reply = await self._grouped(stream, lambda: self._read_reply(stream, start, count))
        if reply is None:
            return None
        replies = cast(list[Any], reply)
        read: list[tuple[str, dict[str, str] | None]] = replies[0][1] if replies else []
        gone = [entry_id for entry_id, fields in read if not fields]
        if gone:
            # XACK answers 0 where the group went away meanwhile, it raises no NOGROUP.
            await self._redis.xack(stream, OUTBOX_GROUP, *gone)
        return [(entry_id, fields) for entry_id, fields in read if fields]

    async def _read_reply(self, stream: str, start: str, count: int) -> Any:
        """The ``XREADGROUP`` reply :meth:`_read` reads (a subclass may send more with it in
        its round trip)."""
        return await self._redis.xreadgroup(
            OUTBOX_GROUP, self._consumer, {stream: start}, count=count
        )

    async def _grouped(self, stream: str, command: Callable[[], Awaitable[Any]]) -> Any:
        """``command``'s reply, run on ``stream``'s group; ``None`` if the stream is gone.

        The group is made where this relay has not made it yet (``_groups``, emptied on every
        connection). One it made may have gone since: a board deleted has its keys unlinked,
        the group with its stream, and a fresh board of its name writes the stream anew; or
        Redis lost it. Its ``NOGROUP`` drops it from ``_groups``, makes it again from the
        stream's first entry (nothing the fresh board wrote is skipped) and runs ``command``
        once more; ``None`` if the group went away again meanwhile (the next pass makes it).
        So a board's lost group holds back neither the board nor the others a pass relays
        after it. A stream is not made: a deleted board's outbox stays deleted. A group first
        used since the relay connected has its long idle consumers forgotten (a board's group
        sees claims only while its outbox holds entries, and each process reading adds one)."""
        for again in (False, True):
            if stream not in self._groups:
                if not await ensure_group(self._redis, stream, OUTBOX_GROUP, make_stream=False):
                    return None
                self._groups.add(stream)
                await self._forget_idle(stream)
                if again:
                    log.info("consumer group lost; made again", relay=self._owner[1], stream=stream)
            try:
                reply = await command()
                self._joined.add(stream)
                return reply
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._groups.discard(stream)
        return None
