"""Redis Pub/Sub to this process's WebSocket clients.

One Pub/Sub connection per API process, subscribed to exactly the channels its clients want
(reference-counted), so that N API replicas each receive only what their own sockets need. The
bookkeeping is kept from both sides (each channel's subscribers, each subscriber's channels), and
a turn of the connection's loop reconciles only the channels that changed since the last, so
that a subscribe, an unsubscribe or a socket's goodbye costs the same with ten sockets or twenty
thousand, and a mass disconnect is linear in the sockets that go. A
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

On a Redis Cluster a PUBLISH reaches the subscribers of every node, so the hub listens on any one
node: ``nodes`` gives the addresses the cluster client knows now, and each connection lost moves
the next connection on to the next of them (the node may be gone for good: a failover). A
PUBLISH made on another node reaches this one over that node's cluster bus link to it, and a
node that drops its link (this one stalled for half the cluster's node timeout, as one that is
failed over does, or the link broke) sends nothing until it has made a new one: what it published
meanwhile never arrives, while the hub's own connection stays up. So every ``LINKS_EVERY``
seconds the hub looks at the links other nodes opened to its node (``CLUSTER LINKS``), and one
made since it last looked tells every client to resync.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

import orjson
import structlog
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

log = structlog.get_logger(__name__)

PUSHED = Counter("ladder_ws_messages_total", "Pub/Sub messages handed to sockets")
CHANNELS = Gauge("ladder_ws_channels", "Pub/Sub channels this process listens to")
RECONNECTS = Counter("ladder_ws_pubsub_reconnects_total", "Pub/Sub connections lost and remade")
RESYNC = orjson.dumps({"type": "resync"}).decode()

PING_AFTER = 5.0
PONG_WITHIN = 3.0
PING_MESSAGE = "ladder-hub"
LINKS_EVERY = 1.0
# Messages handed out in a row at most, before the sockets' senders take their turn: a burst read
# in one go (a batch's rank messages, from one notifier call) would otherwise fill a send queue
# before its sender ran once, and close a client that reads. Not after every message: each turn
# lets the whole process's ready work run, which would slow a busy process's pushes.
YIELD_EVERY = 32


class Subscriber(Protocol):
    def deliver(self, text: str, channel: str = "") -> None:
        """Take a message without blocking: a push of ``channel``, or ("") one to every
        subscriber (``resync``)."""


class Hub:
    def __init__(
        self,
        redis_url: str,
        name: str = "ladder-hub",
        nodes: Callable[[], list[str]] | None = None,
        send_queue: int = 256,
    ) -> None:
        """``name`` is the connection's name in Redis (``CLIENT LIST``); ``nodes``, on a
        cluster, the URLs of its nodes now; ``send_queue`` the sockets' (``LADDER_WS_SEND_QUEUE``),
        which says how often the senders take their turn in a burst of messages."""
        self._yield_every = max(1, min(YIELD_EVERY, send_queue // 2))
        self._redis_url = redis_url
        self._name = name
        self._nodes = nodes
        self._turn = 0
        # Both sides of who listens to what, so that a subscribe, an unsubscribe and a socket's
        # goodbye each cost O(1) per channel it names, whatever the hub holds.
        self._wanted: dict[str, set[Subscriber]] = {}
        self._channels_of: dict[Subscriber, set[str]] = {}
        self._active: set[str] = set()
        # Channels whose wanted-ness changed since the last reconcile: all a turn looks at.
        self._dirty: set[str] = set()
        self._pending: dict[str, list[asyncio.Future[None]]] = {}
        self._changed = asyncio.Event()
        self._stopping = False
        self.connected = False

    async def subscribe(self, channel: str, subscriber: Subscriber, wait: float = 5.0) -> None:
        """Add ``subscriber`` to ``channel``; returns once Redis delivers that channel here."""
        subscribers = self._wanted.get(channel)
        if subscribers is None:
            # Wanted again: a reconcile may be taking it out of Redis right now.
            subscribers = self._wanted[channel] = set()
            self._mark(channel)
        subscribers.add(subscriber)
        self._channels_of.setdefault(subscriber, set()).add(channel)
        if channel in self._active:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(channel, []).append(waiter)
        self._mark(channel)
        try:
            await asyncio.wait_for(waiter, wait)
        finally:
            # Not answered in time (the connection away: no turn answers it), or the caller gone:
            # the waiter goes now, or every refused try would stay until the connection is back.
            waiters = self._pending.get(channel, [])
            if waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._pending[channel]

    def unsubscribe(self, channel: str, subscriber: Subscriber) -> None:
        channels = self._channels_of.get(subscriber)
        if channels is not None:
            channels.discard(channel)
            if not channels:
                del self._channels_of[subscriber]
        subscribers = self._wanted.get(channel)
        if subscribers is None:
            return
        subscribers.discard(subscriber)
        if not subscribers:
            del self._wanted[channel]
            self._mark(channel)

    def forget(self, subscriber: Subscriber) -> None:
        """Take ``subscriber`` off every channel it listens to (a socket that went)."""
        for channel in list(self._channels_of.get(subscriber, ())):
            self.unsubscribe(channel, subscriber)

    @property
    def subscribers(self) -> int:
        """How many subscribers listen to at least one channel."""
        return len(self._channels_of)

    @property
    def channels(self) -> int:
        """How many channels at least one subscriber wants."""
        return len(self._wanted)

    def _mark(self, channel: str) -> None:
        self._dirty.add(channel)
        self._changed.set()

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
                self._turn += 1
            first = False
            self.connected = False
            # A new connection listens to nothing yet: every wanted channel is subscribed
            # again, and every waiter answered, by the next connection's first turn.
            self._active.clear()
            self._dirty.update(self._wanted)
            self._dirty.update(self._pending)
            if not self._stopping:
                await asyncio.sleep(0.5)

    async def _listen(self, resync: bool) -> None:
        client = Redis.from_url(
            self.url,
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
            links = await self._links(client)  # before the first subscribe
            self.connected = True
            heard, pinged = loop.time(), None
            looked, handed = heard, 0
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
                if links is not None and now - looked >= LINKS_EVERY:
                    looked, known, links = now, links, await self._links(client)
                    if links is not None and not links <= known:
                        log.warning("a cluster bus link to the pub/sub node was made again")
                        self._broadcast(RESYNC)
                if message is not None:
                    heard, pinged = now, None
                    if message["type"] == "message":
                        self._dispatch(message["channel"], message["data"])
                        handed += 1
                        if handed % self._yield_every == 0:
                            await asyncio.sleep(0)  # the senders' turn (YIELD_EVERY)
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

    async def _links(self, client: Redis) -> set[tuple[str, int]] | None:
        """On a cluster, the links other nodes opened to the node of ``client``, each as its
        node and the time it was made (ms); ``None`` on one Redis, or where ``CLUSTER LINKS`` is
        refused (then no link is looked at). A node that does not answer within ``PONG_WITHIN``
        fails the connection, as an unanswered ping does."""
        if self._nodes is None:
            return None
        asked = client.execute_command("CLUSTER LINKS")  # type: ignore[no-untyped-call]
        try:
            reply = await asyncio.wait_for(asked, PONG_WITHIN)
        except ResponseError:
            return None
        links = set()
        for link in reply:
            fields = dict(zip(link[::2], link[1::2], strict=True))
            if fields.get("direction") == "from":
                links.add((str(fields.get("node")), int(fields.get("create-time", 0))))
        return links

    @property
    def url(self) -> str:
        """Where the next connection goes: the one Redis, or a cluster's node in turn."""
        urls = (self._nodes() if self._nodes is not None else None) or [self._redis_url]
        return urls[self._turn % len(urls)]

    async def _reconcile(self, pubsub: object) -> None:
        """Bring Redis's subscriptions in line with what is wanted, for the channels marked
        since the last turn only."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        new = [c for c in dirty if c in self._wanted and c not in self._active]
        gone = [c for c in dirty if c not in self._wanted and c in self._active]
        if new:
            await pubsub.subscribe(*new)  # type: ignore[attr-defined]
            self._active.update(new)
        if gone:
            # Inactive from now: a subscribe while the unsubscribe is under way waits for the
            # next turn, which subscribes the channel again.
            self._active.difference_update(gone)
            await pubsub.unsubscribe(*gone)  # type: ignore[attr-defined]
        for channel in dirty:
            if channel in self._pending and (
                channel in self._active or channel not in self._wanted
            ):
                for waiter in self._pending.pop(channel):
                    if not waiter.done():
                        waiter.set_result(None)
        CHANNELS.set(len(self._active))

    def _dispatch(self, channel: str, text: str) -> None:
        for subscriber in list(self._wanted.get(channel, ())):
            subscriber.deliver(text, channel)
            PUSHED.inc()

    def _broadcast(self, text: str) -> None:
        for subscriber in list(self._channels_of):
            subscriber.deliver(text)
