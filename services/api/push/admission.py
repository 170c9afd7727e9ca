"""How many WebSockets the API lets in (docs/api.md section 9).

A process holds at most ``LADDER_WS_MAX`` open sockets; one client address holds at most
``LADDER_WS_MAX_PER_IP`` across every API process that shares the Redis. A slot is taken before
anything else is looked at (Origin, credential), so that a handshake past a cap costs the server
no more than its refusal, and given back when the socket ends, whichever way. Past a cap the
handshake is refused and the sockets already open are left alone.

The per-address count lives in Redis (:meth:`shared.keys.Keys.ws_address`): a sorted set of the
address's sockets, each scored by the end of its lease. A process renews the leases of its open
sockets every ``LEASE_SECONDS / 3``, so the sockets of a process that died without giving its
slots back stop counting within ``LEASE_SECONDS``. A handshake adds its socket, then counts the
set: every count includes the adds before it, so two processes racing for the last slot may both
refuse, never both admit. While Redis does not answer, each process counts its own sockets
alone (pushes need Redis anyway).

The client address is the one uvicorn puts in the ASGI scope: the TCP peer's, or, when that peer
is one of ``LADDER_FORWARDED_ALLOW_IPS`` (a proxy in front of the API), the address its
``X-Forwarded-For`` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from prometheus_client import Counter
from redis.exceptions import RedisError

from services.api.errors import Problem
from shared.keys import Keys

log = structlog.get_logger(__name__)

TURNED_AWAY = Counter(
    "ladder_ws_turned_away_total", "WebSocket handshakes refused past a cap", ["cap"]
)
for _cap in ("address", "process"):  # each series at 0 from the start, for an alert on its rise
    TURNED_AWAY.labels(_cap)

RETRY_AFTER_SECONDS = 5
LEASE_SECONDS = 60


class TooManySockets(Problem):
    """A handshake past a cap: answered 429, or closed with 1013 where the server cannot send
    an HTTP answer to a WebSocket handshake."""

    status, title, slug = 429, "Too many requests", "too-many-sockets"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _per_address_refusal(held: int) -> TooManySockets:
    TURNED_AWAY.labels("address").inc()
    return TooManySockets(
        f"This address holds {held} WebSockets, the most allowed (LADDER_WS_MAX_PER_IP); "
        "close one first."
    )


class SocketSlots:
    """The open sockets of one process, in all and by client address, and their leases in the
    Redis count that every process shares."""

    def __init__(self, most: int, most_per_address: int, redis: Any, keys: Keys) -> None:
        self.most = most
        self.most_per_address = most_per_address
        self.open = 0
        self._redis = redis
        self._keys = keys
        self._names = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count())
        # This process's sockets by address: their names in the shared count.
        self._mine: dict[str, set[str]] = {}
        self._stopping = asyncio.Event()

    def of(self, address: str) -> int:
        """How many sockets ``address`` holds open in this process."""
        return len(self._mine.get(address, ()))

    @asynccontextmanager
    async def held(self, address: str) -> AsyncIterator[None]:
        """A slot for a socket from ``address`` while the block runs; :class:`TooManySockets`
        past a cap, with nothing taken."""
        if self.of(address) >= self.most_per_address:
            raise _per_address_refusal(self.of(address))
        if self.open >= self.most:
            TURNED_AWAY.labels("process").inc()
            raise TooManySockets("This server holds all the WebSockets it may; retry shortly.")
        # Both slots taken before the Redis count is awaited: handshakes that arrive meanwhile
        # see them, so a burst cannot pass the process cap (or this process's own count).
        name = next(self._names)
        self._mine.setdefault(address, set()).add(name)
        self.open += 1
        try:
            held = await self._claim(address, name)
            if held > self.most_per_address:
                raise _per_address_refusal(held - 1)
            yield
        finally:
            self.open -= 1
            names = self._mine.get(address, set())
            names.discard(name)
            if not names:
                self._mine.pop(address, None)
            await self._give_back(address, name)

    async def _claim(self, address: str, name: str) -> int:
        """Add ``name`` to the address's shared count; the count with it (this process's own,
        which holds it already, while Redis does not answer)."""
        key, now = self._keys.ws_address(address), time.time()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(key, "-inf", now)
                pipe.zadd(key, {name: now + LEASE_SECONDS})
                pipe.zcard(key)
                pipe.expire(key, LEASE_SECONDS)
                _, _, count, _ = await pipe.execute()
            return int(count)
        except (RedisError, OSError) as exc:
            log.warning("socket count unavailable; counting this process's", error=str(exc))
            return self.of(address)

    async def _give_back(self, address: str, name: str) -> None:
        try:
            await self._redis.zrem(self._keys.ws_address(address), name)
        except (RedisError, OSError) as exc:  # its lease runs out instead
            log.warning("socket slot not given back", error=str(exc))

    async def renew(self) -> None:
        """Extend the leases of this process's open sockets (one pipeline), adding back any the
        shared count lost (a Redis restarted or failed over, or out of reach past a lease)."""
        if not self._mine:
            return
        until = time.time() + LEASE_SECONDS
        renewed = {address: set(names) for address, names in self._mine.items()}
        async with self._redis.pipeline(transaction=False) as pipe:
            for address, names in renewed.items():
                key = self._keys.ws_address(address)
                pipe.zadd(key, dict.fromkeys(names, until))
                pipe.expire(key, LEASE_SECONDS)
            await pipe.execute()
        # A socket that ended while the pipeline ran may have been given back before it was
        # renewed, and added again: take those out once more.
        for address, names in renewed.items():
            for name in names - self._mine.get(address, set()):
                await self._give_back(address, name)

    async def run(self) -> None:
        """:meth:`renew` every third of a lease until :meth:`stop`."""
        while not self._stopping.is_set():
            try:
                await self.renew()
            except (RedisError, OSError) as exc:
                log.warning("socket leases not renewed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), LEASE_SECONDS / 3)

    def stop(self) -> None:
        self._stopping.set()
