"""MySQL's named locks (``GET_LOCK``), held by one connection for a block.

A named lock is server-wide, so it orders work across API processes and machines sharing the
history database, and it lives as long as its session: a process that dies frees its locks.
Board definitions (shared/db_boards.py), a user's friends (shared/friendships.py) and a user's
hiding on a board (shared/hidden.py) each take theirs through :func:`named_locks`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


class LockTimeout(RuntimeError):
    """A named lock was not had in time: another holder kept it."""


@contextlib.asynccontextmanager
async def named_locks(
    engine: AsyncEngine,
    names: Iterable[str],
    wait_seconds: float,
    refusal: LockTimeout,
) -> AsyncIterator[AsyncConnection]:
    """A connection holding the named locks ``names`` (each at most 64 characters) for the block,
    taken in one order, so that two holders of several never deadlock on them. Raises
    ``refusal`` if any is not had within ``wait_seconds``. The block starts on a fresh
    transaction: its first read sees every change committed by the locks' holder before; what
    it leaves uncommitted is rolled back before the locks are released."""
    ordered = sorted(set(names))
    params = {f"n{i}": name for i, name in enumerate(ordered)}
    taking = ", ".join(f"GET_LOCK(:n{i}, :wait)" for i in range(len(ordered)))
    releasing = ", ".join(f"RELEASE_LOCK(:n{i})" for i in range(len(ordered)))
    async with engine.connect() as conn:
        try:
            got = (
                await conn.execute(text(f"SELECT {taking}"), {**params, "wait": wait_seconds})
            ).one()
            await conn.commit()
            if any(g != 1 for g in got):
                raise refusal
            yield conn
        finally:
            try:
                await conn.rollback()
                await conn.execute(text(f"SELECT {releasing}"), params)
                await conn.commit()
            except Exception:
                # Closing the connection frees its locks, and keeps a connection that may still
                # hold one out of the pool.
                await conn.invalidate()
