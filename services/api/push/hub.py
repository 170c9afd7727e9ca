"""Redis Pub/Sub to this process's WebSocket clients.

One Pub/Sub connection per API process, subscribed to exactly the channels its clients want
(reference-counted), so that N API replicas each receive only what their own sockets need. A
message is handed to every subscriber's bounded send queue without waiting; the subscriber
decides what to do when its queue is full. If the Pub/Sub connection drops, the hub reconnects,
subscribes again, and only then tells every client to resync, since pushes may have been missed
meanwhile.

Each connection is a fresh client with redis-py's own retries off. redis-py can mend a broken
Pub/Sub connection behind its caller's back (reconnect and resubscribe inside ``get_message``,
with the default retry policy of ``Redis(...)``), and whatever was published in the gap is then
lost without a word; here every failure reaches :meth:`Hub.run`, which owns the resync. A
connection that goes silent without breaking (a peer or network gone without a reset, which
redis-py does not notice: redis/redis-py#2417) is caught by a ping: one after
``PING_AFTER`` seconds without traffic, and the connection is given up if no answer comes
within ``PONG_WITHIN``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import orjson
import structlog
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

log = structlog.get_logger(__name__)

PUSHED = Counter("ladder_ws_messages_total", "Pub/Sub messages handed to sockets")
CHANNELS = Gauge("ladder_ws_channels", "Pub/Sub channels this process listens to")
RECONNECTS = Counter("ladder_ws_pubsub_reconnects_total", "Pub/Sub connections lost and remade")
RESYNC = orjson.dumps({"type": "resync"}).decode()

PING_AFTER = 5.0
PONG_WITHIN = 3.0
PING_MESSAGE = "ladder-hub"


class Subscriber(Protocol):
    def deliver(self, text: str) -> None:
        """Take a message without blocking."""


class Hub:
    def __init__(self, redis_url: str, name: str = "ladder-hub") -> None:
        """``name`` is the connection's name in Redis (``CLIENT LIST``)."""
        self._redis_url = redis_url
        self._name = name
        self._wanted: dict[str, set[Subscriber]] = {}
        self._active: set[str] = set()
        self._pending: dict[str, list[asyncio.Future[None]]] = {}
        self._changed = asyncio.Event()
        self._stopping = False
        self.connected = False

    async def subscribe(self, channel: str, subscriber: Subscriber, wait: float = 5.0) -> None:
        """Add ``subscriber`` to ``channel``; returns once Redis delivers that channel here."""
        self._wanted.setdefault(channel, set()).add(subscriber)
        if channel in self._active:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(channel, []).append(waiter)
        self._changed.set()
        await asyncio.wait_for(waiter, wait)

    def unsubscribe(self, channel: str, subscriber: Subscriber) -> None:
        subscribers = self._wanted.get(channel)
        if subscribers is None:
            return
        subscribers.discard(subscriber)
        if not subscribers:
            del self._wanted[channel]
            self._changed.set()

    def forget(self, subscriber: Subscriber) -> None:
        for channel in [c for c, subs in self._wanted.items() if subscriber in subs]:
            self.unsubscribe(channel, subscriber)

    def stop(self) -> None:
        self._stopping = True
        self._changed.set()

    async def run(self) -> None:
        first = True
        while not self._stopping:
            try:
                await self._listen(resync=not first)
            except Exception as exc:
                RECONNECTS.inc()
                log.warning("pub/sub connection lost; reconnecting", error=repr(exc))
            first = False
            self.connected = False
            self._active.clear()
            if not self._stopping:
                await asyncio.sleep(0.5)

    async def _listen(self, resync: bool) -> None:
        client = Redis.from_url(
            self._redis_url,
            decode_responses=True,
            client_name=self._name,
            retry=Retry(NoBackoff(), 0),
            # RESP2: a subscribed connection answers PING with ["pong", message], which
            # get_message hands back. Under RESP3 the answer is a plain string, which redis-py's
            # Pub/Sub parser mistakes for something else once replies are decoded, so every
            # ping would look unanswered and the connection be remade every few seconds.
            protocol=2,
        )
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        loop = asyncio.get_running_loop()
        pinged: float | None
        try:
            await client.ping()
            self.connected = True
            heard, pinged = loop.time(), None
            while not self._stopping:
                await self._reconcile(pubsub)
                if resync:
                    # Every wanted channel is subscribed again: a client that re-reads now
                    # misses nothing published after its read.
                    self._broadcast(RESYNC)
                    resync = False
                if not self._active:
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 1.0)
                    await client.ping()
                    heard, pinged = loop.time(), None
                    continue
                message = await pubsub.get_message(timeout=0.05)
                now = loop.time()
                if message is not None:
                    heard, pinged = now, None
                    if message["type"] == "message":
                        self._dispatch(message["channel"], message["data"])
                elif pinged is None and now - heard >= PING_AFTER:
                    await pubsub.ping(PING_MESSAGE)
                    pinged = now
                elif pinged is not None and now - pinged >= PONG_WITHIN:
                    raise RedisConnectionError("no answer to a ping on the pub/sub connection")
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _reconcile(self, pubsub: object) -> None:
        wanted = set(self._wanted)
        new = wanted - self._active
        gone = self._active - wanted
        if new:
            await pubsub.subscribe(*new)  # type: ignore[attr-defined]
            self._active |= new
        if gone:
            await pubsub.unsubscribe(*gone)  # type: ignore[attr-defined]
            self._active -= gone
        for channel in list(self._pending):
            if channel in self._active or channel not in wanted:
                for waiter in self._pending.pop(channel):
                    if not waiter.done():
                        waiter.set_result(None)
        CHANNELS.set(len(self._active))

    def _dispatch(self, channel: str, text: str) -> None:
        for subscriber in list(self._wanted.get(channel, ())):
            subscriber.deliver(text)
            PUSHED.inc()

    def _broadcast(self, text: str) -> None:
        everyone = {s for subs in self._wanted.values() for s in subs}
        for subscriber in everyone:
            subscriber.deliver(text)
