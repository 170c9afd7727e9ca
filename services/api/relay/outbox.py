"""The outbox relay: accepted events from Redis to the broker, confirmed, then removed.

Each board's outbox is a Redis stream read through the consumer group ``relay``; every API
process (every worker) is one consumer of it, so each entry goes to one of them. A read takes up
to ``IN_FLIGHT`` batches of ``LADDER_RELAY_BATCH`` entries; each batch becomes one persistent
message (see :mod:`shared.events`), each event in it carrying its entry id as ``outbox_id`` (the
order of the board's writes, which the event log keeps for a rebuild, whichever of the relays
publishes it), all of them published at once with their publisher confirms awaited together;
only once the broker has confirmed every one are the entries acknowledged and deleted, in the
round trip of the outbox's next read (which follows at once: a read that found entries is
followed by another, and on the way out every outbox that holds entries is read), so that a
message costs Redis one round trip, not two. Under load the outbox fills between two reads and
the messages fill up: the broker, which tops out at a few thousand persistent messages a second
to the three quorum queues, sees a few hundred events in each.

A write wakes a read of its own board's outbox, read again as long as it finds entries. Every
``_SWEEP_SECONDS`` a sweep also reads each outbox that holds entries (another process wrote them
and could not relay them, or left them unconfirmed), found with one pipelined ``XLEN`` for up to
``SWEEP_MOST`` boards, the next ones at the next sweep (shared/relaying.py), and every board at
each claim (every ``_CLAIM_EVERY_SECONDS``): so a write costs Redis reads of the boards it was
written to, and an idle relay one round trip of a bounded size a sweep, however many boards
there are. After a read that found less than a message's worth, the relay waits as long as a
few reads take before the next: under load a read waits its turn in a busy Redis for
milliseconds, and the next message gathers what was written meanwhile; idle, the wait is a
fraction of a millisecond, and a lone event has gone out before it. A read that could not be
confirmed stays pending for this consumer and is published again; entries left pending by a
crashed process are claimed by a live one after ``LADDER_RELAY_CLAIM_IDLE_MS``, all of them at
its next claim, and read as its own pending ones, before new ones. Consumers are idempotent on
``event_id``, so a batch published twice has one effect.

Every message is published ``mandatory``: a message that no queue is bound to receive comes back
(``Basic.Return``) ahead of its confirm, and a confirm alone does not remove it. Its entries stay
pending in the outbox and are published again, with backoff, until a queue takes them; meanwhile
``ladder_relay_unroutable`` counts them and ``P:relay:unroutable`` says why, for ``/readyz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any

import aio_pika
import orjson
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from aio_pika.exceptions import PublishError
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis

from shared.boards import BoardCatalog
from shared.events import message_body, with_outbox_id
from shared.keys import OUTBOX_GROUP, Keys
from shared.relaying import Entry, RelayMetrics, StreamRelay
from shared.settings import LadderSettings

log = structlog.get_logger(__name__)

RELAYED = Counter("ladder_relay_events_total", "Events confirmed by the broker")
MESSAGES = Counter("ladder_relay_messages_total", "Messages confirmed by the broker")
FAILURES = Counter(
    "ladder_relay_failures_total",
    "Connection attempts that failed (stage=connect: no broker answers, or it refuses the "
    "topology) and reads whose batches the broker did not confirm (stage=publish)",
    ["stage"],
)
for _stage in ("connect", "publish"):  # each series at 0 from the start, for an alert on its rise
    FAILURES.labels(_stage)
BACKLOG = Gauge(
    "ladder_relay_backlog",
    "Entries in the outbox at the last look (every pass, and every retry while the broker is away)",
    ["board_id"],
    multiprocess_mode="livemax",
)
CONNECTED = Gauge(
    "ladder_relay_connected",
    "1 while the relay is connected to the broker (the least of the API processes)",
    multiprocess_mode="livemin",
)
METRICS = RelayMetrics(CONNECTED, FAILURES, BACKLOG)
UNROUTABLE = Gauge(
    "ladder_relay_unroutable",
    "Entries the outbox keeps because the broker returns its messages unroutable (0: routed)",
    ["board_id"],
    multiprocess_mode="livemax",
)
RETURNED = Counter(
    "ladder_relay_returned_total", "Messages the broker returned unroutable (no queue bound)"
)

_BOARDS_REFRESH_SECONDS = 2.0
_CLAIM_EVERY_SECONDS = 5.0
# How often the outboxes that hold entries are looked for, whoever wrote them: the longest an
# entry that another process wrote waits when that process cannot relay it (it died after its
# write), beyond the claim of what it had read.
_SWEEP_SECONDS = 0.25
# After a read that found less than a message's worth, the relay waits as long as this many
# reads took (the last one's time), at most _GATHER_MOST seconds.
_GATHER_READS = 8
_GATHER_MOST = 0.05
# Messages awaiting their confirms at once, a read.
IN_FLIGHT = 8
# Seconds between two publishes of entries the broker returned: from the first to the last.
_UNROUTABLE_BACKOFF = (0.5, 5.0)
# A board's record in P:relay:unroutable older than this is no longer reported: the relay that
# wrote it renews it on every retry, at most _UNROUTABLE_BACKOFF[1] apart.
UNROUTABLE_FRESH_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Unroutable:
    """Why a board's outbox is kept: what the broker answered, and how much it holds back."""

    reason: str
    held: int
    at: float  # time.time() of the last return

    def describe(self, board_id: str) -> str:
        return (
            f"board {board_id}: {self.held} events kept in the outbox, the broker returns "
            f"their messages ({self.reason})"
        )


async def unroutable_boards(
    redis: Redis, keys: Keys, now: float | None = None
) -> dict[str, Unroutable]:
    """The boards whose outbox some relay keeps because the broker returns its messages (a
    record renewed within ``UNROUTABLE_FRESH_SECONDS``), whichever API process relays them."""
    now = time.time() if now is None else now
    found: dict[str, Unroutable] = {}
    raw = await redis.hgetall(keys.relay_unroutable)
    for board_id, value in raw.items():
        record = Unroutable(**orjson.loads(value))
        if now - record.at <= UNROUTABLE_FRESH_SECONDS:
            found[str(board_id)] = record
    return found


class Relay(StreamRelay):
    """Every board's outbox to ``ladder.scores``: :meth:`run` until :meth:`stop`, woken by
    :meth:`wake` after a write."""

    def __init__(
        self, redis: Redis, keys: Keys, catalog: BoardCatalog, settings: LadderSettings
    ) -> None:
        super().__init__(redis, keys, catalog, settings, ("api", "relay"), METRICS, keys.outbox)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        # Streams known to hold no entry pending for this consumer (read, not yet confirmed).
        self._settled: set[str] = set()
        self._written: set[str] = set()
        # Seconds the last read of an outbox took.
        self._read_took = 0.0
        # Boards whose messages came back unroutable: when to publish them again, and the wait
        # after that.
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        # Entries the broker confirmed and routed, by stream (with their board): acknowledged
        # and deleted in the round trip of the stream's next read.
        self._confirmed: dict[str, tuple[str, list[str]]] = {}

    def wake(self, board_id: str) -> None:
        """Called after a write: relay now rather than at the next poll (and know the board,
        should it be newer than the last look at the catalog)."""
        self._written.add(board_id)
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        await self.relay_until(self._stopping)

    async def _declare(self, channel: AbstractChannel) -> AbstractExchange:
        self._settled.clear()
        await self._topology.declare(channel)
        return await self._topology.declare_exchange(channel)

    async def _pump(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        boards: list[str] = []
        boards_at = claim_at = sweep_at = 0.0
        # Boards whose last read found entries: read again at once, as more may be waiting.
        busy: set[str] = set()
        while not stop.is_set():
            self._note_connection()
            now = loop.time()
            if now >= boards_at:
                boards = [b.board_id for b in await self._catalog.all()]
                boards_at = now + _BOARDS_REFRESH_SECONDS
                self._forget_gone(boards)
            written, self._written = self._written, set()
            if not written.issubset(boards):
                boards = sorted({*boards, *written})
            claim = now >= claim_at
            if claim:
                claim_at = now + _CLAIM_EVERY_SECONDS
            # A pass reads the boards this process wrote to and those still busy; on a sweep,
            # every board's outbox that holds entries (another process wrote them and left).
            targets = written | busy
            if claim or now >= sweep_at:
                sweep_at = now + _SWEEP_SECONDS
                # A claim looks at every board: one a dead process left entries pending on may
                # be anywhere in the sweeps' turn.
                swept = boards if claim else self._next_sweep(boards)
                targets |= await self._holding_entries(swept)
            busy, most = set(), 0
            for board_id in sorted(targets):
                moved = await self._relay_board(board_id, claim)
                if moved:
                    busy.add(board_id)
                    most = max(most, moved)
            if busy:
                if most < self._settings.relay_batch:
                    # Less than a message's worth: wait as long as a few reads take, so that
                    # the next message gathers what is written meanwhile. Under load a read
                    # waits its turn in a busy Redis for milliseconds; idle, it takes a tenth.
                    wait = min(_GATHER_MOST, _GATHER_READS * self._read_took)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
                continue
            if not self._written:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, sweep_at - loop.time()))
        # Drain what is already in the outbox before going, within the grace period.
        for board_id in sorted(await self._holding_entries(boards)):
            while await self._relay_board(board_id, False):
                pass

    async def _holding_entries(self, boards: list[str]) -> set[str]:
        """Those of ``boards`` whose outbox holds entries (``_lengths``); the backlog gauges of
        all of them set to what was found."""
        lengths = await self._lengths(boards)
        self._set_backlog(boards, lengths)
        return set(lengths)

    def _emptied(self, board_id: str) -> None:
        BACKLOG.labels(board_id).set(0)
        UNROUTABLE.labels(board_id).set(0)

    def _forget_gone(self, boards: list[str]) -> None:
        """As the base's, and this relay's own of each board gone: its reads settled, and its
        unroutable messages' backoff."""
        super()._forget_gone(boards)
        kept = set(boards)
        self._settled &= {self._keys.outbox(board_id) for board_id in kept}
        self._retry_at = {b: at for b, at in self._retry_at.items() if b in kept}
        self._backoff = {b: wait for b, wait in self._backoff.items() if b in kept}
        self._confirmed = {k: v for k, v in self._confirmed.items() if v[0] in kept}

    async def _relay_board(self, board_id: str, claim: bool) -> int:
        retry_at = self._retry_at.get(board_id)
        if retry_at is not None and asyncio.get_running_loop().time() < retry_at:
            return 0
        stream = self._keys.outbox(board_id)
        if claim and await self._claim(stream, self._settings.relay_batch * IN_FLIGHT):
            self._settled.discard(stream)
        # Our own pending entries first (a read not yet confirmed), then new ones.
        for start in (">",) if stream in self._settled else ("0", ">"):
            started = time.perf_counter()
            entries = await self._read(stream, start, self._settings.relay_batch * IN_FLIGHT)
            self._read_took = time.perf_counter() - started
            if entries is None:
                return 0  # its stream is gone, or its group went away twice: next pass
            if entries:
                self._settled.discard(stream)
                if not await self._publish(board_id, stream, entries):
                    return 0  # kept pending: read again once its backoff has passed
                if start == ">":
                    # Nothing was pending before this read, and this read is confirmed now.
                    self._settled.add(stream)
                return len(entries)
            if start == "0":
                self._settled.add(stream)
        BACKLOG.labels(board_id).set(0)
        UNROUTABLE.labels(board_id).set(0)
        self._gauged.discard(board_id)
        return 0

    async def _publish(self, board_id: str, stream: str, entries: list[Entry]) -> bool:
        """Publish ``entries`` and remove those the broker confirmed and routed; whether all
        were. Returned ones stay pending for this consumer, to be published again."""
        exchange = self._exchange
        if exchange is None:
            raise aio_pika.exceptions.AMQPConnectionError("no channel")
        size = self._settings.relay_batch
        batches = [entries[i : i + size] for i in range(0, len(entries), size)]
        try:
            # Every message of the read in flight at once; each publish returns on its confirm.
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._publish_batch(exchange, board_id, batch))
                    for batch in batches
                ]
        except BaseExceptionGroup as group_error:
            FAILURES.labels("publish").inc()
            raise group_error.exceptions[0] from group_error
        returns = [task.result() for task in tasks]
        outcomes = list(zip(batches, returns, strict=True))
        routed = [eid for batch, r in outcomes if r is None for eid, _ in batch]
        returned = [(batch, r) for batch, r in outcomes if r is not None]
        RELAYED.inc(len(routed))
        MESSAGES.inc(len(batches) - len(returned))
        if not returned:
            # Acknowledged and deleted with the next read of the stream, in its round trip: a
            # read that found entries is read again at once (_pump), or on the way out.
            _, before = self._confirmed.get(stream, (board_id, []))
            self._confirmed[stream] = (board_id, before + routed)
            UNROUTABLE.labels(board_id).set(0)
            self._retry_at.pop(board_id, None)
            self._backoff.pop(board_id, None)
            return True
        async with self._redis.pipeline(transaction=False) as pipe:
            if routed:
                pipe.xack(stream, OUTBOX_GROUP, *routed)
                pipe.xdel(stream, *routed)
            pipe.xlen(stream)
            *_, backlog = await pipe.execute()
        BACKLOG.labels(board_id).set(backlog)
        UNROUTABLE.labels(board_id).set(backlog)
        if backlog:
            self._gauged.add(board_id)
        # Everything in the outbox waits behind these: the relay reads further only once they
        # are routed. Renewed on every return, so that /readyz sees it whichever process asks;
        # counted once /readyz can see it.
        record = Unroutable(_reason(returned[0][1], exchange.name), backlog, time.time())
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._keys.relay_unroutable, board_id, orjson.dumps(asdict(record)))
            pipe.expire(self._keys.relay_unroutable, int(UNROUTABLE_FRESH_SECONDS) * 2)
            await pipe.execute()
        RETURNED.inc(len(returned))
        wait = self._backoff.get(board_id, _UNROUTABLE_BACKOFF[0])
        self._backoff[board_id] = min(wait * 2, _UNROUTABLE_BACKOFF[1])
        self._retry_at[board_id] = asyncio.get_running_loop().time() + wait
        log.warning(
            "broker returned messages unroutable; the outbox keeps their events",
            board_id=board_id,
            returned=sum(len(batch) for batch, _ in returned),
            kept=backlog,
            reason=_reason(returned[0][1], exchange.name),
            retry_in_seconds=wait,
        )
        return False

    async def _read_reply(self, stream: str, start: str, count: int) -> Any:
        """The read, after the acknowledgement and deletion of the entries confirmed since the
        last read of ``stream`` in the same round trip (with its board's unroutable record, and
        the stream's length for the backlog gauge): a message costs Redis one round trip."""
        confirmed = self._confirmed.get(stream)
        if confirmed is None:
            return await super()._read_reply(stream, start, count)
        board_id, entry_ids = confirmed
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xack(stream, OUTBOX_GROUP, *entry_ids)
            pipe.xdel(stream, *entry_ids)
            pipe.hdel(self._keys.relay_unroutable, board_id)
            pipe.xlen(stream)
            pipe.xreadgroup(OUTBOX_GROUP, self._consumer, {stream: start}, count=count)
            *done, backlog, reply = await pipe.execute(raise_on_error=False)
        for failed in (*done, backlog):
            if isinstance(failed, Exception):
                raise failed
        del self._confirmed[stream]
        BACKLOG.labels(board_id).set(backlog)
        if backlog:
            self._gauged.add(board_id)
        if isinstance(reply, Exception):
            raise reply  # NOGROUP: the group is made again and the read sent again (_grouped)
        return reply

    async def _publish_batch(
        self, exchange: AbstractExchange, board_id: str, batch: list[Entry]
    ) -> PublishError | None:
        """One message of ``batch``, confirmed: ``None``, or the return if no queue took it."""
        message = aio_pika.Message(
            message_body([with_outbox_id(entry_id, fields["e"]) for entry_id, fields in batch]),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=f"{board_id}:{batch[0][0]}:{batch[-1][0]}",
            type="score.accepted",
        )
        try:
            await exchange.publish(message, routing_key="", mandatory=True, timeout=10)
        except PublishError as returned:
            return returned
        return None


def _reason(returned: PublishError, exchange: str) -> str:
    frame = returned.message.delivery if returned.message is not None else None
    code = getattr(frame, "reply_code", "?")
    text = getattr(frame, "reply_text", "unroutable")
    return f"{code} {text}: no queue is bound to exchange {exchange}"
