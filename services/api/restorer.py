"""Redis brought back to the history database: board definitions, friendships and hidden users.

Redis may keep nothing across a restart; MySQL keeps both for good. The API restores them as it
starts (:meth:`Restorer.attempt`) and, should MySQL be away then, keeps trying in the background
(:meth:`Restorer.retry`) while it serves with what Redis holds: scores keep flowing, and boards
that only MySQL knows answer 404 until it is back. Once restored, it reconciles the friend sets
with MySQL every ``LADDER_FRIENDS_RECONCILE_SECONDS`` (0: only at start-up), taking out what
MySQL no longer has as well as putting in what Redis lost.

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

from shared import hidden
from shared.boards import BoardCatalog
from shared.db_boards import LockTimeout
from shared.erasure import restore_projections
from shared.keys import Keys
from shared.restore import reconcile_friendships, restore_definitions

log = structlog.get_logger(__name__)

RETRY_MAX_SECONDS = 30.0


class Restorer:
    def __init__(
        self,
        engine: AsyncEngine,
        redis: Redis,
        keys: Keys,
        catalog: BoardCatalog,
        reconcile_every: float = 0.0,
    ) -> None:
        self._engine = engine
        self._reconcile_every = reconcile_every
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._stop = asyncio.Event()
        self.done = False

    async def restore(self) -> None:
        """Write every stored definition over Redis, make the friend sets what MySQL holds and
        hide again whom a Redis that lost its data no longer hides; store board ``main`` in
        MySQL first if it is not there yet."""
        stored = await restore_definitions(self._engine, self._catalog)
        await restore_projections(self._engine, self._redis, self._keys)
        friends = await reconcile_friendships(self._engine, self._redis, self._keys)
        rehidden = await hidden.restore(self._engine, self._redis, self._keys)
        self.done = True
        log.info(
            "restored from the history database",
            boards=len(stored),
            friend_sets=friends.users,
            added=friends.added,
            removed=friends.removed,
            hidden_again=rehidden,
        )

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
        """Attempt again, backing off, until one restore succeeded or :meth:`stop`; then
        reconcile the friend sets every ``reconcile_every`` seconds, if that is not 0."""
        delay = 1.0
        while not self.done:
            if await self._stopped_after(delay):
                return
            await self.attempt()
            delay = min(delay * 2, RETRY_MAX_SECONDS)
        while self._reconcile_every > 0:
            if await self._stopped_after(self._reconcile_every):
                return
            await self.reconcile()

    async def reconcile(self) -> None:
        """One reconcile of the friend sets; a warning if MySQL or Redis cannot answer (the
        next one tries again)."""
        try:
            friends = await reconcile_friendships(self._engine, self._redis, self._keys)
        except (DBAPIError, RedisError) as exc:
            log.warning("friend sets not reconciled", error=str(exc).splitlines()[0])
            return
        if friends.added or friends.removed:
            log.info("friend sets reconciled", added=friends.added, removed=friends.removed)

    async def _stopped_after(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
