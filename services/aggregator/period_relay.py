"""The period outbox relay: ``period.closed`` messages from Redis to ``ladder.periods``.

The close (services/aggregator/closer.py) appends each message to the board's period outbox in
the same atomic step as its claim. Every aggregator process is a consumer of the outbox's group
``relay``: each entry goes to one of them, is published persistent and mandatory with its
publisher confirm awaited, and only then acknowledged and deleted. A broker that is down, or
that routes the message to no queue (nobody has bound one to ``ladder.periods`` yet), leaves the
entry where it is, to be published again; an entry left pending by a process that died is
claimed by another after ``LADDER_RELAY_CLAIM_IDLE_MS`` (the connection, the group and the reads
are shared/relaying.py's). Each poll finds the outboxes that hold entries with one pipelined
``XLEN`` for up to ``SWEEP_MOST`` boards, the next ones at the next poll (every board at a
claim, every ``CLAIM_EVERY_SECONDS``), and reads those alone. Only a process that dies between
the broker's confirm and the acknowledgement publishes a message twice: the copies carry the
same ``message_id``, by which a consumer can tell them apart. Each entry is marked as being
published (``ladder_publishing_period_v1``) from just before its publish until it is deleted or
given up, and only if it is still there as read: a user's erasure rewrites no message the broker
may be taking, and one it rewrote since the read goes out rewritten alone
(services/api/erased_periods.py), so that no rewriting follows its original under the same
``message_id``. The close keeps it in the entry
(``<board>:<period>:<period_id>``, a season's with its end, ``/<Unix seconds>``); an entry that
the version before queued has none, and goes out with the id it made from the body, the one it
went out with before if it did. A deleted board's outbox that still held entries was parked by
its deletion (shared/parked_periods.py): each poll publishes the parked outboxes' entries the
same way, and removes each one found empty.
"""

from __future__ import annotations

import asyncio
import contextlib

import aio_pika
import orjson
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis

from shared.boards import BoardCatalog
from shared.functions import PUBLISHING_PERIOD_FUNCTION
from shared.keys import OUTBOX_GROUP, Keys
from shared.parked_periods import drop_if_empty, is_parked, parked_set, publishing_marks
from shared.relaying import RelayMetrics, StreamRelay
from shared.settings import LadderSettings

log = structlog.get_logger(__name__)

PUBLISHED = Counter("ladder_periods_published_total", "period.closed messages confirmed")
FAILURES = Counter(
    "ladder_periods_publish_failures_total",
    "Connection attempts of the period relay that failed (stage=connect: no broker answers, or "
    "it refuses the topology) and period.closed publishes refused or returned (stage=publish)",
    ["stage"],
)
for _stage in ("connect", "publish"):  # each series at 0 from the start, for an alert on its rise
    FAILURES.labels(_stage)
BACKLOG = Gauge(
    "ladder_periods_backlog",
    "period.closed messages in the board's period outbox at the last look (every poll, and "
    "every retry while the broker is away)",
    ["board_id"],
)
CONNECTED = Gauge("ladder_periods_relay_connected", "1 while the period relay is connected")
DROPPED = Counter(
    "ladder_periods_dropped_total",
    "period.closed messages dropped unpublished, the oldest of a full period outbox, by a close "
    "past LADDER_PERIODS_OUTBOX_MAX (no queue bound to ladder.periods, or the broker away)",
)

POLL_SECONDS = 0.5
CLAIM_EVERY_SECONDS = 5.0
READ = 50
# How long an entry's mark as being published holds (ms): longer than a publish may take (its
# confirm is awaited 10 s at most), so that only a relay that died leaves one to lapse.
MARK_MS = 15_000


def message_id(entry: dict[str, str]) -> str:
    """The ``message_id`` of an outbox entry's message (the module's docstring)."""
    if entry.get("i"):
        return entry["i"]
    fields = orjson.loads(entry["m"])
    return f"{fields['board_id']}:{fields['period']}:{fields['period_id']}"


class PeriodRelay(StreamRelay):
    """Every board's period outbox to ``ladder.periods``, until the ``stop`` of
    ``relay_until(stop)``."""

    def __init__(
        self, redis: Redis, keys: Keys, catalog: BoardCatalog, settings: LadderSettings
    ) -> None:
        super().__init__(
            redis,
            keys,
            catalog,
            settings,
            ("aggregator", "period-relay"),
            RelayMetrics(CONNECTED, FAILURES, BACKLOG),
            keys.periods_outbox,
        )
        # The outboxes whose next message came back unrouted: said once, not every poll.
        self._unrouted: set[str] = set()

    async def _declare(self, channel: AbstractChannel) -> AbstractExchange:
        return await self._topology.declare_periods_exchange(channel)

    def _forget_gone(self, boards: list[str]) -> None:
        """As every relay forgets the deleted boards (their gauges, their streams' groups), and
        the deleted boards' outboxes among those said to wait for a queue: a board made again
        under the name says so again of its own first message. The parked outboxes (a deleted
        board's messages, still to go) keep their groups, made and joined, and their place until
        emptied."""
        parked = {s for s in self._groups if is_parked(self._keys, s)}
        joined = {s for s in self._joined if is_parked(self._keys, s)}
        super()._forget_gone(boards)
        self._groups |= parked
        self._joined |= joined
        defined = {self._keys.periods_outbox(board_id) for board_id in boards}
        self._unrouted = {s for s in self._unrouted if s in defined or is_parked(self._keys, s)}

    async def _pump(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        claim_at = 0.0
        while not stop.is_set():
            self._note_connection()
            claim = loop.time() >= claim_at
            if claim:
                claim_at = loop.time() + CLAIM_EVERY_SECONDS
            boards = [board.board_id for board in await self._catalog.all()]
            self._forget_gone(boards)
            swept = boards if claim else self._next_sweep(boards)
            lengths = await self._lengths(swept)
            self._set_backlog(swept, lengths)
            for board_id in sorted(lengths):
                await self.relay_board(board_id, claim)
            await self.relay_parked(claim)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_SECONDS)

    async def relay_board(self, board_id: str, claim: bool) -> int:
        """Publish the board's waiting messages (ours pending first); how many were confirmed."""
        return await self._relay_stream(self._keys.periods_outbox(board_id), claim)

    async def relay_parked(self, claim: bool) -> int:
        """Publish the messages of the deleted boards' parked outboxes (shared/parked_periods.py),
        and forget each parked outbox found empty; how many were confirmed."""
        done = 0
        names: set[str] = await self._redis.smembers(parked_set(self._keys))  # type: ignore[assignment]
        for parked in sorted(names):
            done += await self._relay_stream(parked, claim)
            if not await self._redis.xlen(parked) and await drop_if_empty(
                self._redis, self._keys, parked
            ):
                self._groups.discard(parked)
                self._joined.discard(parked)
                self._unrouted.discard(parked)
                log.info("parked period outbox emptied", stream=parked)
        return done

    async def _relay_stream(self, stream: str, claim: bool) -> int:
        if claim:
            await self._claim(stream, READ)
        done = 0
        marks = publishing_marks(stream)
        for start in ("0", ">"):
            entries = await self._read(stream, start, READ)
            for entry_id, fields in entries or []:
                if not await self._publish_entry(stream, marks, entry_id, fields):
                    return done
                # The mark goes after the entry: an erasure's pass never finds the entry there
                # unmarked once its message is confirmed.
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.xack(stream, OUTBOX_GROUP, entry_id)
                    pipe.xdel(stream, entry_id)
                    pipe.hdel(marks, entry_id)
                    await pipe.execute()
                done += 1
            if entries is None:
                return done
        return done

    async def _publish_entry(
        self, stream: str, marks: str, entry_id: str, fields: dict[str, str]
    ) -> bool:
        """Publish the entry's message, marked as being published meanwhile, if it is still in
        the outbox as read; whether the entry is to be acknowledged and deleted (not where its
        message was routed to no queue: it waits). An entry an erasure replaced since the read
        (services/api/erased_periods.py) is acknowledged without a publish: its rewriting, later
        in the outbox, goes out in its place."""
        if not fields.get("m"):
            return True
        call = (PUBLISHING_PERIOD_FUNCTION, 2, stream, marks, entry_id, MARK_MS)
        if not int(await self._redis.fcall(*call)):
            return True
        try:
            await self._publish(fields)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.error("period outbox entry is no message; dropped", entry=entry_id)
        except aio_pika.exceptions.DeliveryError:
            # Routed to no queue: it waits (pending) for a queue to be bound.
            await self._redis.hdel(marks, entry_id)
            if stream not in self._unrouted:
                self._unrouted.add(stream)
                log.info("period.closed routed to no queue; it waits", stream=stream)
            return False
        except BaseException:
            # Not confirmed: an erasure may rewrite it now (else the mark lapses).
            with contextlib.suppress(Exception):
                await self._redis.hdel(marks, entry_id)
            raise
        if stream in self._unrouted:
            self._unrouted.discard(stream)
            log.info("period.closed routed to a queue again", stream=stream)
        return True

    async def _publish(self, entry: dict[str, str]) -> None:
        exchange = self._exchange
        if exchange is None:
            raise aio_pika.exceptions.AMQPConnectionError("no channel")
        message = aio_pika.Message(
            entry["m"].encode(),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=message_id(entry),
            type="period.closed",
        )
        try:
            # Mandatory: a message no queue takes comes back, and waits in the outbox.
            await exchange.publish(message, routing_key="", mandatory=True, timeout=10)
        except Exception:
            FAILURES.labels("publish").inc()
            raise
        PUBLISHED.inc()
