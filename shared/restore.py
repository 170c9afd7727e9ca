"""Board definitions and friendships written back into Redis from the history database.

MySQL keeps both for good; Redis may have lost them. The API does this as it starts
(:mod:`services.api.restorer`) and ``make rebuild`` does it before it rebuilds the boards
(:mod:`services.rebuild`); services never import each other, so the code they share is here.

The cost is one pass over the ``boards`` table and one over ``friendships``, read in pages of
the primary key and written with ``SADD`` (idempotent), a pipeline per page: linear in the
number of friendships in time, but not in memory.
"""

from __future__ import annotations

from collections import defaultdict

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.boards import MAIN_BOARD, MAIN_BOARD_ID, Board, BoardCatalog
from shared.db_boards import all_friendships, definitions_lock, load_boards, save_board
from shared.keys import Keys


async def restore_definitions(engine: AsyncEngine, catalog: BoardCatalog) -> list[Board]:
    """Write every stored definition over Redis, under the definitions lock (so a ``PUT``
    racing it cannot be overwritten with an older definition); store board ``main`` in MySQL
    first if it is not there yet. Returns the stored boards. Raises
    :class:`shared.db_boards.LockTimeout` if the lock is not had."""
    async with definitions_lock(engine) as conn:
        stored = await load_boards(conn)
        if all(board.board_id != MAIN_BOARD_ID for board in stored):
            await save_board(conn, MAIN_BOARD, replace=False)
            stored = await load_boards(conn)
        await catalog.restore(stored)
    return stored


async def restore_friendships(engine: AsyncEngine, redis: Redis, keys: Keys) -> int:
    """Add every stored friendship to the users' sets; returns how many rows were written."""
    written = 0
    async for page in all_friendships(engine):
        by_user: dict[str, list[str]] = defaultdict(list)
        for user_id, friend_id in page:
            by_user[user_id].append(friend_id)
        async with redis.pipeline(transaction=False) as pipe:
            for user_id, friends in by_user.items():
                pipe.sadd(keys.friends(user_id), *friends)
            await pipe.execute()
        written += len(page)
    return written
