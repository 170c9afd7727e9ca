"""Redis brought back to the history database at start-up: board definitions and friendships.

Redis may keep nothing across a restart; MySQL keeps both for good. The API restores them as it
starts (:meth:`Restorer.attempt`) and, should MySQL be away then, keeps trying in the background
(:meth:`Restorer.retry`) while it serves with what Redis holds: scores keep flowing, and boards
that only MySQL knows answer 404 until it is back.

The restore itself is :mod:`shared.restore`, which ``make rebuild`` runs too.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.boards import BoardCatalog
from shared.db_boards import LockTimeout
from shared.keys import Keys
from shared.restore import restore_definitions, restore_friendships

log = structlog.get_logger(__name__)

RETRY_MAX_SECONDS = 30.0


class Restorer:
    def __init__(
        self, engine: AsyncEngine, redis: Redis, keys: Keys, catalog: BoardCatalog
    ) -> None:
        self._engine = engine
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._stop = asyncio.Event()
        self.done = False

    async def restore(self) -> None:
        """Write every stored definition and friendship over Redis; store board ``main`` in
        MySQL first if it is not there yet."""
        stored = await restore_definitions(self._engine, self._catalog)
        friendships = await restore_friendships(self._engine, self._redis, self._keys)
        self.done = True
        log.info("restored from the history database", boards=len(stored), friendships=friendships)

    async def attempt(self) -> bool:
        """:meth:`restore`, or a warning if MySQL (or Redis) cannot answer: down, not migrated."""
        try:
            await self.restore()
        except (DBAPIError, LockTimeout, RedisError) as exc:
            log.warning(
                "board definitions and friendships not restored; Redis serves as it is",
                error=str(exc).splitlines()[0],
            )
            return False
        return True

    async def retry(self) -> None:
        """Attempt again, backing off, until one restore succeeded or :meth:`stop`."""
        delay = 1.0
        while not self.done:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stop.is_set():
                return
            await self.attempt()
            delay = min(delay * 2, RETRY_MAX_SECONDS)

    def stop(self) -> None:
        self._stop.set()
