"""Redis brought back to the history database at start-up: board definitions and friendships.

Redis may keep nothing across a restart; MySQL keeps both for good. The API restores them as it
starts (:meth:`Restorer.attempt`) and, should MySQL be away then, keeps trying in the background
(:meth:`Restorer.retry`) while it serves with what Redis holds: scores keep flowing, and boards
that only MySQL knows answer 404 until it is back.

The cost of a restore is one pass over the ``boards`` table and one over ``friendships``, read
in pages of the primary key and written with ``SADD`` (idempotent), a pipeline per page: linear
in the number of friendships, in time, but not in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.boards import MAIN_BOARD, MAIN_BOARD_ID, BoardCatalog
from shared.db_boards import (
    LockTimeout,
    all_friendships,
    definitions_lock,
    load_boards,
    save_board,
)
from shared.keys import Keys

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
        async with definitions_lock(self._engine) as conn:
            stored = await load_boards(conn)
            if all(board.board_id != MAIN_BOARD_ID for board in stored):
                await save_board(conn, MAIN_BOARD, replace=False)
                stored = await load_boards(conn)
            await self._catalog.restore(stored)
        friendships = 0
        async for page in all_friendships(self._engine):
            by_user: dict[str, list[str]] = defaultdict(list)
            for user_id, friend_id in page:
                by_user[user_id].append(friend_id)
            async with self._redis.pipeline(transaction=False) as pipe:
                for user_id, friends in by_user.items():
                    pipe.sadd(self._keys.friends(user_id), *friends)
                await pipe.execute()
            friendships += len(page)
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
