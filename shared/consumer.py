"""The consumer skeleton every service shares: decode, validate, hand a batch over, ack.

A handler is ``async def handle(events: list[ScoreAccepted]) -> None``; it never sees an AMQP
object. The runner collects deliveries into a batch (up to ``batch_size`` messages, each
carrying one event or several, or whatever arrived within ``flush_ms`` of the first, or until
no message came for ``idle_gap``, so that a lone message is not held back the whole
``flush_ms``: it is on the way of every push; a consumer off the push path, the history writer or
the aggregator, takes the whole window instead, and its batches fill), calls the handler once, and
only when it returns acks the whole batch with one ``multiple`` ack.

What fails, and what the runner does (docs/reliability.md, "A handler failure"):

- A message that is not a valid :class:`ScoreMessage` as a whole but has its envelope (a known
  schema version, a list of events) is read event by event (:func:`shared.events.split_message`):
  each event failing the schema is logged and counted, the others go to the handler with the
  batch, and once they are handled the message is rejected without requeue (before the batch's
  ``multiple`` ack, which leaves a settled delivery alone): dead-lettered whole at once, so that
  ``<queue>.dead`` keeps the refused events, and a replay hands the others again, which every
  handler takes once (idempotent on event_id). Its other events refused, it is requeued (below).
- Any other message that is not a valid :class:`ScoreMessage` (not JSON, an unknown schema
  version) is poison: rejected without requeue, so the queue dead-letters it at once.
- A handler that fails because something it needs is away (:func:`shared.failures.is_transient`:
  MySQL or Redis down, a timeout) holds the batch unacked and retries it with backoff for as
  long as the outage lasts. Nothing is given back to the queue, so nothing counts toward the
  delivery limit and nothing is dead-lettered.
- A handler that refuses the batch (any other error: MySQL refusing a value, say) has the
  batch split: each message handled alone, and each event of a refused message alone, so that
  every event that can be handled is. Each message still holding a refused event is given back
  (``nack`` with requeue), which the quorum queue counts: delivered ``LADDER_DELIVERY_LIMIT`` + 1
  times in all (21), it is dead-lettered to ``<queue>.dead``, whole. The other messages are
  acked and the stream flows on.

A broker that answers but refuses the topology as configured (``PRECONDITION_FAILED``: the
queue exists with another ``x-delivery-limit``, say, after ``LADDER_DELIVERY_LIMIT`` changed) is
a configuration error: logged as one, naming the queue, the argument and the setting, and tried
again with backoff (up to a minute between tries), so that the consumer starts once the setting
or the queue is changed, without a restart. ``/readyz`` says why meanwhile (:meth:`reasons`).

Decoding is one pass of pydantic-core over the body (``model_validate_json``): about 150 events
a message, a few objects each, which is why the runner tunes the process's garbage collector
once it is consuming (:func:`shared.heap.settle_heap`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue, AbstractRobustConnection
from pydantic import ValidationError

from shared import amqp
from shared.consumer_metrics import (
    BATCH_SECONDS,
    CONNECTED,
    EVENTS,
    EVENTS_REFUSED,
    MESSAGES,
    RETRIES,
    series_from_start,
)
from shared.events import ScoreAccepted, ScoreMessage, split_message, why_invalid
from shared.failures import is_transient, short_reason
from shared.heap import settle_heap
from shared.topology import (
    Consumer,
    Topology,
    client_properties,
    consumer_tag,
    topology_refusal,
)

log = structlog.get_logger(__name__)

Handler = Callable[[list[ScoreAccepted]], Awaitable[None]]

# A message, its events for the handler, and whether to dead-letter it once they are handled.
Decoded = tuple[AbstractIncomingMessage, list[ScoreAccepted], bool]


# The longest wait between two tries of a topology the broker refuses (a configuration error:
# nothing changes it but an operator).
REFUSED_BACKOFF_MOST = 60.0

# A batch is handed over once the stream pauses this long. Under load deliveries follow each
# other far closer than this, and batches fill up to batch_size or flush_ms as before.
IDLE_GAP_SECONDS = 0.003


@dataclass
class ConsumerRunner:
    name: Consumer
    # LADDER_AMQP_URL: one broker address, or every node of a cluster, comma-separated.
    amqp_url: str
    topology: Topology
    handler: Handler
    prefetch: int = 256
    batch_size: int = 500
    flush_ms: int = 50
    # How long a pause in the stream ends a batch before flush_ms; None: the batch takes all of
    # flush_ms (a consumer off the push path, whose batches may fill).
    idle_gap: float | None = IDLE_GAP_SECONDS
    connection: AbstractRobustConnection | None = None
    _inbox: asyncio.Queue[AbstractIncomingMessage] = field(default_factory=asyncio.Queue)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _consuming: bool = False
    # Why the last connection, or declaration of the topology, failed (a short line with no
    # address in it); and the error a held batch is being retried on (an outage).
    _connection_error: str | None = None
    _handler_error: str | None = None

    @property
    def ready(self) -> bool:
        """Consuming now: a robust connection that is reconnecting is not ready, nor one whose
        topology the broker refused."""
        return (
            self._consuming
            and self.connection is not None
            and not self.connection.is_closed
            and self.connection.connected.is_set()
        )

    def reasons(self) -> dict[str, str]:
        """Why the consumer is not consuming, or is holding a batch, for ``/readyz``:
        ``broker`` while not ready (the last connection error, or the topology the broker
        refuses), ``handler`` while a batch is held and retried on an outage."""
        found: dict[str, str] = {}
        if not self.ready:
            found["broker"] = self._connection_error or "not connected to the broker (yet)"
        if self._handler_error is not None:
            found["handler"] = f"a batch is held and retried: {self._handler_error}"
        return found

    async def _connect(self) -> AbstractRobustConnection | None:
        """The first connection, retried with backoff while the broker is away (a consumer
        that exits instead would be given up on by its process manager); ``None`` if asked
        to stop meanwhile."""
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                return await amqp.connect_robust(
                    self.amqp_url.split(","),
                    reconnect_interval=1.0,
                    client_properties=client_properties(self.name, "consumer"),
                )
            except Exception as exc:
                self._connection_error = short_reason(exc)
                log.warning("broker unavailable; retrying", error=repr(exc), in_seconds=backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
                backoff = min(backoff * 2, 5.0)
        return None

    async def run(self) -> None:
        """Consume until :meth:`stop`; then finish and ack the batch in hand, and return."""
        series_from_start(self.name)  # samples from the start, the broker away or not
        backoff = 1.0
        while not self._stopping.is_set():
            self.connection = await self._connect()
            if self.connection is None:
                return
            try:
                channel = await self.connection.channel()
                await channel.set_qos(prefetch_count=self.prefetch)
                try:
                    queues = await self.topology.declare(channel)
                except Exception as exc:
                    refused = topology_refusal(exc)
                    if refused is None:
                        raise
                    self._connection_error = refused.describe()
                    log.error(
                        "broker refuses the topology: configuration error; retrying",
                        consumer=self.name,
                        reason=self._connection_error,
                        in_seconds=backoff,
                        **refused.fields(),
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), backoff)
                    backoff = min(backoff * 2, REFUSED_BACKOFF_MOST)
                    continue
                await self._consume(queues)
                return
            finally:
                await self.connection.close()

    async def _consume(self, queues: dict[Consumer, AbstractQueue]) -> None:
        tag = await queues[self.name].consume(self._inbox.put, consumer_tag=consumer_tag(self.name))
        settle_heap()
        self._connection_error = None
        self._consuming = True
        CONNECTED.labels(self.name).set(1)
        log.info("consuming", queue=self.topology.queue(self.name), prefetch=self.prefetch)
        try:
            await self._loop()
        finally:
            self._consuming = False
            CONNECTED.labels(self.name).set(0)
            with contextlib.suppress(Exception):
                await queues[self.name].cancel(tag)

    def stop(self) -> None:
        self._stopping.set()

    async def _next(self, wait: float | None) -> AbstractIncomingMessage | None:
        getter = asyncio.ensure_future(self._inbox.get())
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait(
                {getter, stopper}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()
        if getter in done:
            return getter.result()
        getter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await getter
        if getter.done() and not getter.cancelled():
            # It completed while being cancelled: keep the message.
            return getter.result()
        return None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            first = await self._next(None)
            if first is None:
                return
            batch = [first]
            deadline = loop.time() + self.flush_ms / 1000
            count = 1
            while True:
                while not self._inbox.empty() and count < self.batch_size:
                    batch.append(self._inbox.get_nowait())
                    count += 1
                remaining = deadline - loop.time()
                if count >= self.batch_size or remaining <= 0:
                    break
                gap = remaining if self.idle_gap is None else min(remaining, self.idle_gap)
                more = await self._next(gap)
                if more is None:
                    break
                batch.append(more)
                count += 1
            await self._process(batch)

    async def _process(self, batch: list[AbstractIncomingMessage]) -> None:
        decoded = [read for message in batch if (read := await self._decode(message)) is not None]
        if not decoded:
            return
        kept = decoded
        error = await self._handle([event for _, events, _ in decoded for event in events])
        if error is not None:
            # Something in the batch is refused: find what, handling one message at a time
            # (and one event at a time within a refused one), so that every event that can be
            # handled is, and only the messages holding a refused event go back to the queue.
            log.warning("batch refused; handling its messages one by one", error=repr(error))
            kept = []
            for read in decoded:
                if await self._split(read[1]):
                    kept.append(read)
                else:
                    await self._refuse(read[0])
        # A message holding an event the schema refused is dead-lettered now that its other events
        # are handled, and before the multiple ack, which would otherwise cover it.
        for message, events, _ in [read for read in kept if read[2]]:
            await self._dead_letter(message, len(events))
        kept = [read for read in kept if not read[2]]
        if not kept:
            return
        try:
            # Refused and dead-lettered messages are settled: a multiple ack covers the others.
            await kept[-1][0].ack(multiple=True)
        except Exception as exc:
            # The channel went away with the batch: the broker delivers it again, and every
            # handler is idempotent on event_id.
            log.warning("ack lost with the channel; the batch will be redelivered", error=repr(exc))
            return
        MESSAGES.labels(self.name, "ok").inc(len(kept))
        EVENTS.labels(self.name).inc(sum(len(events) for _, events, _ in kept))

    async def _decode(self, message: AbstractIncomingMessage) -> Decoded | None:
        """A message's events for the handler, or ``None`` for a message settled here: poison,
        or read event by event and holding no valid event (both dead-lettered at once)."""
        try:
            return message, ScoreMessage.model_validate_json(message.body).events, False
        except ValidationError as exc:
            errors = why_invalid(exc)
        if (split := split_message(message.body)) is None:
            log.warning(
                "poison message dead-lettered", message_id=message.message_id, errors=errors
            )
            MESSAGES.labels(self.name, "poison").inc()
            await self._reject(message)
            return None
        valid, refused = split
        for refusal in refused:
            log.error(
                "event refused by the schema",
                message_id=message.message_id,
                board_id=refusal.board_id,
                event_id=refusal.event_id,
                errors=refusal.errors,
            )
        EVENTS_REFUSED.labels(self.name, "schema").inc(len(refused))
        if valid:
            # Dead-lettered once they are handled; or, with no event refused (each valid alone:
            # the whole nested only just too deep for pydantic's parser), acked as any other.
            return message, valid, bool(refused)
        await self._dead_letter(message, 0)
        return None

    async def _dead_letter(self, message: AbstractIncomingMessage, handled: int) -> None:
        """Dead-letter, whole, a message holding an event the schema refused, its ``handled``
        other events handled: the operator finds the refused events in ``<queue>.dead``."""
        log.warning(
            "message with an event the schema refuses dead-lettered; its other events handled",
            message_id=message.message_id,
            handled=handled,
        )
        MESSAGES.labels(self.name, "poison-split").inc()
        EVENTS.labels(self.name).inc(handled)
        await self._reject(message)

    @staticmethod
    async def _reject(message: AbstractIncomingMessage) -> None:
        # A channel lost meanwhile gives it back to the queue, to be read again.
        with contextlib.suppress(Exception):
            await message.reject(requeue=False)

    async def _handle(self, events: list[ScoreAccepted]) -> BaseException | None:
        """Hand ``events`` to the handler until it succeeds (``None``) or refuses them (the
        error). A transient failure (:func:`shared.failures.is_transient`: MySQL or Redis
        away) holds them and retries with backoff, for as long as it lasts: the messages stay
        unacked, so nothing counts toward their delivery limit."""
        backoff = 0.2
        while True:
            try:
                with BATCH_SECONDS.labels(self.name).time():
                    await self.handler(events)
                self._handler_error = None
                return None
            except Exception as exc:
                RETRIES.labels(self.name).inc()
                if not is_transient(exc):
                    self._handler_error = None
                    return exc
                self._handler_error = short_reason(exc)
                log.warning(
                    "handler failed (transient); batch held and retried",
                    events=len(events),
                    error=repr(exc),
                    in_seconds=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _split(self, events: list[ScoreAccepted]) -> bool:
        """Whether every event of one message could be handled: the message together first,
        then (refused) each event alone, so that its good events are handled all the same."""
        error = await self._handle(events)
        if error is None:
            return True
        if len(events) > 1:
            refusals = [(e, err) for e in events if (err := await self._handle([e])) is not None]
        else:
            refusals = [(events[0], error)]
        for event, err in refusals:
            log.error(
                "event refused by the handler",
                board_id=event.board_id,
                event_id=event.event_id,
                error=repr(err),
            )
        EVENTS_REFUSED.labels(self.name, "handler").inc(len(refusals))
        return not refusals

    async def _refuse(self, message: AbstractIncomingMessage) -> None:
        """Give a message with a refused event back to its queue, which counts the delivery:
        past ``LADDER_DELIVERY_LIMIT`` redeliveries the queue dead-letters it to ``.dead``."""
        headers = message.headers or {}
        count = headers.get("x-delivery-count")
        delivery = (count if isinstance(count, int) else 0) + 1
        last = delivery > self.topology.delivery_limit
        log.warning(
            "message refused; dead-lettered" if last else "message refused; requeued",
            message_id=message.message_id,
            delivery=delivery,
            deliveries_before_dead_letter=self.topology.delivery_limit + 1,
        )
        MESSAGES.labels(self.name, "dead-lettered" if last else "refused").inc()
        with contextlib.suppress(Exception):
            # A lost channel returns it all the same (and the broker counts that too).
            await message.nack(requeue=True)
