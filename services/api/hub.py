"""Redis Pub/Sub to this process's WebSocket clients.

One Pub/Sub connection per API process, subscribed to exactly the channels its clients want
(reference-counted), so that N API replicas each receive only what their own sockets need. A
message is handed to every subscriber's bounded send queue without waiting; the subscriber
decides what to do when its queue is full. If the Pub/Sub connection drops, the hub reconnects,
subscribes again, and tells every client to resync, since pushes may have been missed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import orjson
import structlog
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis

log = structlog.get_logger(__name__)

PUSHED = Counter("ladder_ws_messages_total", "Pub/Sub messages handed to sockets")
CHANNELS = Gauge("ladder_ws_channels", "Pub/Sub channels this process listens to")
RESYNC = orjson.dumps({"type": "resync"}).decode()


class Subscriber(Protocol):
    def deliver(self, text: str) -> None:
        """Take a message without blocking."""


class Hub:
    def __init__(self, redis_url: str) -> None:
        self._redis_url = redis_url
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
                log.warning("pub/sub connection lost; reconnecting", error=repr(exc))
            first = False
            self.connected = False
            self._active.clear()
            if not self._stopping:
                await asyncio.sleep(0.5)

    async def _listen(self, resync: bool) -> None:
        client = Redis.from_url(self._redis_url, decode_responses=True)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await client.ping()
            self.connected = True
            if resync:
                self._broadcast(RESYNC)
            while not self._stopping:
                await self._reconcile(pubsub)
                if not self._active:
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 1.0)
                    await client.ping()
                    continue
                message = await pubsub.get_message(timeout=0.05)
                if message is not None and message["type"] == "message":
                    self._dispatch(message["channel"], message["data"])
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
