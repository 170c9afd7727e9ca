"""Board definitions and friendships written back into Redis from the history database.

MySQL keeps both for good; Redis may have lost them, or (friendships) hold some that MySQL no
longer has: a failed ``SREM``, a crash between the two writes, two changes of one pair whose
Redis commands crossed. The API does this as it starts (:mod:`services.api.restorer`), and then
reconciles the friend sets every ``LADDER_FRIENDS_RECONCILE_SECONDS``; ``make rebuild`` does it
before it rebuilds the boards (:mod:`services.rebuild`); services never import each other, so
the code they share is here.

The friendships' reconcile makes every friend set hold what MySQL holds, taking members out as
well as putting them in. It is two passes: one over the ``friendships`` table, a page of users
at a time (:func:`shared.friendships.friends_by_user`), each page's sets read in one pipeline and
only those that differ written; then one over the friend sets Redis holds (``SCAN``), for users
MySQL has no friendship of. Each set is changed by one command (``SADD`` of what is missing or
``SREM`` of what is extra), or both in one ``MULTI`` of that key when both are needed, so a reader
never sees a set that is neither the old one nor the new one. Time is linear in the friendships
and friend sets; memory is one page.

A change made while a pass runs can be undone by it (the pass read MySQL before the change and
writes Redis after): the next pass puts it right. Redis therefore converges to MySQL within one
interval of the last change.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.boards import MAIN_BOARD, MAIN_BOARD_ID, Board, BoardCatalog
from shared.db_boards import definitions_lock, load_boards, save_board
from shared.friendships import FRIENDSHIP_PAGE, friends_by_user, users_with_friends
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


@dataclass
class Reconciled:
    """What a friendships reconcile did."""

    users: int = 0
    """Friend sets compared (users with friends in MySQL, and sets that only Redis had)."""
    added: int = 0
    """Members put in that MySQL had and Redis lacked."""
    removed: int = 0
    """Members taken out that Redis had and MySQL did not."""


async def reconcile_friendships(
    engine: AsyncEngine, redis: Redis, keys: Keys, page: int = FRIENDSHIP_PAGE
) -> Reconciled:
    """Make every friend set in Redis hold exactly the user's friendships in MySQL."""
    done = Reconciled()
    async for wanted in friends_by_user(engine, page):
        await _converge(redis, keys, wanted, done)
    # Sets of users with no friendship left in MySQL: the pass above never named them.
    batch: list[str] = []
    async for key in redis.scan_iter(match=keys.friends_match(), count=page, _type="set"):
        batch.append(keys.friends_owner(key))
        if len(batch) >= page:
            await _empty_orphans(engine, redis, keys, batch, done)
            batch = []
    await _empty_orphans(engine, redis, keys, batch, done)
    return done


async def _empty_orphans(
    engine: AsyncEngine, redis: Redis, keys: Keys, users: list[str], done: Reconciled
) -> None:
    kept = await users_with_friends(engine, users)
    await _converge(redis, keys, {u: set() for u in users if u not in kept}, done)


async def _converge(
    redis: Redis, keys: Keys, wanted: dict[str, set[str]], done: Reconciled
) -> None:
    """Bring each user's set to ``wanted[user]``: one pipeline reads them all, a second writes
    the differences."""
    users = list(wanted)
    if not users:
        return
    done.users += len(users)
    async with redis.pipeline(transaction=False) as pipe:
        for user in users:
            pipe.smembers(keys.friends(user))
        held: list[set[str]] = await pipe.execute()
    both: list[tuple[str, set[str], set[str]]] = []
    async with redis.pipeline(transaction=False) as pipe:
        for user, have in zip(users, held, strict=True):
            missing, extra = wanted[user] - have, have - wanted[user]
            done.added += len(missing)
            done.removed += len(extra)
            if missing and extra:
                both.append((user, missing, extra))
            elif missing:
                pipe.sadd(keys.friends(user), *missing)
            elif extra:
                pipe.srem(keys.friends(user), *extra)
        await pipe.execute()
    for user, missing, extra in both:
        # One key, so one MULTI is atomic and cluster-safe.
        async with redis.pipeline(transaction=True) as pipe:
            pipe.sadd(keys.friends(user), *missing)
            pipe.srem(keys.friends(user), *extra)
            await pipe.execute()
