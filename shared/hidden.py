"""Hidden users (a shadow ban, docs/api.md section 8b; docs/architecture.md, "Hidden users").

A hidden user's entry in every view of the board is its record alone (in the view's hash): its
member is in no sorted set, so every rank, count and page closes up exactly. The board's set
``{P:B}:hidden`` names them for the write and the merge, which keep the records up to date without
putting the members back; :func:`move` takes the members out of the views that exist (or puts them
back), then marks the user for the merge, the views for the next snapshot and their periods'
MVP views, so that the aggregator pushes the new tops and MVPs and history snapshots the views
as they now are.

MySQL's ``hidden_users`` is the truth (the API writes it first); the rebuild fills the Redis set
from it, and the API's start (:func:`restore`) puts back in it whoever a Redis that lost its data
no longer names.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared import db_locks
from shared.db import boards as boards_table
from shared.db import hidden_users as hidden_table
from shared.db import to_db_time
from shared.db_locks import named_locks
from shared.functions import HIDE_FUNCTION
from shared.keys import Keys, dirty_member, parse_view

# The views a user can have an entry in, after the hash tag: a region's or the global board of a
# period (the teams board ranks teams, whose totals keep a hidden user's contribution).
# Views a call moves at most (four keys each).
_CHUNK = 64


async def hidden_users(redis: Redis, keys: Keys, board_id: str) -> set[str]:
    """The board's hidden users (a small set: moderation's)."""
    found: Any = await redis.smembers(keys.hidden(board_id))
    return set(found)


async def board_views(redis: Redis, keys: Keys, board_id: str) -> list[tuple[str, str, str]]:
    """Every regional and global view of the board kept in Redis, as (period, period_id, scope),
    found by their hashes of records (a view whose only entry is hidden has no sorted set). A
    SCAN of the keyspace: moderation is rare, and its cost is that of the keyspace's size."""
    tag = keys.tag(board_id)
    found: list[tuple[str, str, str]] = []
    async for key in redis.scan_iter(match=f"{tag}:lb:*:ties", count=1000, _type="hash"):
        view = parse_view(key[len(tag) + 1 :].removesuffix(":ties"))
        if key.startswith(tag + ":lb:") and view is not None:
            period, period_id, region = view
            found.append((period, period_id, "global" if region is None else f"region:{region}"))
    return sorted(found)


async def move(redis: Redis, keys: Keys, board_id: str, user_id: str, *, show: bool) -> int:
    """Take ``user_id``'s members out of every view of the board (``show=False``) or put them
    back from its records; then mark it for the aggregator's merge in every view it has a record
    in (the merge puts the global entry right and pushes the changed tops) and the views for the
    next snapshot. The Redis set of hidden users must already say so. Returns how many views
    changed."""
    views = await board_views(redis, keys, board_id)
    changed = 0
    for start in range(0, len(views), _CHUNK):
        call_keys: list[str] = []
        for period, period_id, scope in views[start : start + _CHUNK]:
            view = keys.board_view(board_id, period, period_id, scope)
            call_keys += [view, keys.ties(view), keys.distinct(view), keys.distinct_building(view)]
        reply: Any = await redis.fcall(
            HIDE_FUNCTION, len(call_keys), *call_keys, user_id, "show" if show else "hide"
        )
        changed += int(reply)
    async with redis.pipeline(transaction=False) as pipe:
        for period, period_id, scope in views:
            pipe.hexists(keys.ties(keys.board_view(board_id, period, period_id, scope)), user_id)
        held: list[Any] = await pipe.execute()
    touched = [v for v, has in zip(views, held, strict=True) if has]
    marks = [
        dirty_member(period, period_id, scope.removeprefix("region:"), user_id)
        for period, period_id, scope in touched
        if scope != "global"
    ]
    snapshots = [f"{period}|{period_id}|{scope}" for period, period_id, scope in touched]
    # The MVP views of those periods are computed again (the user listed, or not).
    periods = sorted({f"{period}|{period_id}" for period, period_id, _ in touched})
    async with redis.pipeline(transaction=False) as pipe:
        if marks:
            pipe.sadd(keys.dirty(board_id), *marks)
        if snapshots:
            pipe.sadd(keys.snapshot_dirty(board_id), *snapshots)
        if periods:
            pipe.sadd(keys.mvp_dirty(board_id), *periods)
        await pipe.execute()
    return changed


# -- MySQL, the truth ---------------------------------------------------------------------------

# How long a hide or show waits for another one of the same user on the same board.
LOCK_WAIT_SECONDS = 10


class LockTimeout(db_locks.LockTimeout):
    """Another hide or show of the same user on the same board held its lock for too long."""


@contextlib.asynccontextmanager
async def changing(
    engine: AsyncEngine, board_id: str, user_id: str
) -> AsyncIterator[AsyncConnection]:
    """The block holds the named lock of ``user_id`` on ``board_id`` (MySQL's, server-wide, so
    across API processes): a hide and a show of one user run one after the other, each through
    its row, the set and the views. Without it, one asked while the other moved the views ran
    through whole in between, and the first's move then undid it in the views alone (the user
    shown in MySQL and the set, yet in no view; or hidden there, yet listed). It yields the
    lock's connection, for the block's :func:`store`: a block that took a second connection of
    the pool while holding this one would wait on the others holding theirs (a burst of hides
    of many users exhausting the pool). Raises :class:`LockTimeout` if the lock is not had
    within ``LOCK_WAIT_SECONDS``."""
    # Lock names are at most 64 characters: the database names the deployment, a digest keeps
    # any board and user id short.
    key = f"{engine.url.database}\0{board_id}\0{user_id}".encode()
    name = f"ladder.hidden.{hashlib.sha256(key).hexdigest()[:40]}"
    refusal = LockTimeout("another hide or show of this user is under way")
    async with named_locks(engine, [name], LOCK_WAIT_SECONDS, refusal) as conn:
        yield conn


async def store(
    db: AsyncEngine | AsyncConnection, board_id: str, user_id: str, *, hidden: bool
) -> bool:
    """Record ``user_id`` hidden on ``board_id`` (or not): idempotent either way, committed
    before it returns (on ``db``'s own connection when it is one, which holds the user's lock:
    :func:`changing`). Whether the row changed (it was not so already)."""
    if isinstance(db, AsyncConnection):
        changed = await _store(db, board_id, user_id, hidden)
        await db.commit()
        return changed
    async with db.begin() as conn:
        return await _store(conn, board_id, user_id, hidden)


async def _store(conn: AsyncConnection, board_id: str, user_id: str, hidden: bool) -> bool:
    t = hidden_table
    where = (t.c.board_id == board_id, t.c.user_id == user_id)
    if not hidden:
        return bool((await conn.execute(delete(t).where(*where))).rowcount)
    # Looked for, then inserted if absent (the user's lock keeps another hide of it out between
    # the two): an INSERT IGNORE of a user hidden already raised a duplicate-entry warning, which
    # the driver logged at every repeated hide, and an INSERT ... SELECT ... WHERE NOT EXISTS
    # took gap locks that made concurrent hides of other users deadlock.
    if (await conn.execute(select(t.c.user_id).where(*where))).first() is not None:
        return False
    now = to_db_time(datetime.now(UTC))
    await conn.execute(insert(t).values(board_id=board_id, user_id=user_id, hidden_at=now))
    return True


async def stored(conn: AsyncConnection, board_id: str) -> list[str]:
    """The users MySQL holds hidden on ``board_id``."""
    t = hidden_table
    rows = await conn.execute(select(t.c.user_id).where(t.c.board_id == board_id))
    return sorted(row.user_id for row in rows)


async def restore(engine: AsyncEngine, redis: Redis, keys: Keys) -> int:
    """Hide again, in Redis, every user MySQL holds hidden whom its board's Redis set lacks (a
    Redis that lost its data, or a hide whose Redis step failed): the set, then :func:`move`, as
    the hide does. Boards under a rebuild are left to it (it stages the set from MySQL). Only
    adds: a user the set names and MySQL does not is a show under way, which its own route
    finishes; and MySQL is read again after the adds, so that a show stored meanwhile (its
    row deleted, then its user taken out of the set) is not undone: whichever comes second,
    the show's ``SREM`` or this check, shows the user. A board MySQL no longer defines (being
    deleted) is left alone. Returns how many users were hidden again."""
    t = hidden_table
    # Only on boards MySQL defines: a deleted board's rows stay until its deletion's finish, and
    # its set, hidden again after the deletion's last pass, would hide them on a fresh board of
    # the name.
    defined = select(boards_table.c.board_id)
    async with engine.connect() as conn:
        rows = (
            await conn.execute(select(t.c.board_id, t.c.user_id).where(t.c.board_id.in_(defined)))
        ).all()
    by_board: dict[str, set[str]] = {}
    for row in rows:
        by_board.setdefault(row.board_id, set()).add(row.user_id)
    restored = 0
    for board_id, users in sorted(by_board.items()):
        if await redis.exists(keys.rebuilding(board_id)):
            continue
        missing = users - await hidden_users(redis, keys, board_id)
        if not missing:
            continue
        for user_id in sorted(missing):
            await redis.sadd(keys.hidden(board_id), user_id)
            await move(redis, keys, board_id, user_id, show=False)
        async with engine.connect() as conn:
            shown = missing - set(await stored(conn, board_id))
        for user_id in sorted(shown):
            await redis.srem(keys.hidden(board_id), user_id)
            await move(redis, keys, board_id, user_id, show=True)
        restored += len(missing - shown)
    return restored
