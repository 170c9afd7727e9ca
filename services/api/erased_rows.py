"""The history database's side of an erasure and of a board's purge (docs/api.md section 8b),
for the worker in :mod:`services.api.eraser`: deletes go in statements of ``DELETE_CHUNK`` rows,
each its own transaction, so that none holds MySQL's locks for long; every step is idempotent."""

from __future__ import annotations

from datetime import datetime

import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import score_events, snapshots, to_db_time

DELETE_CHUNK = 5000  # MySQL rows a DELETE statement
SNAPSHOT_PAGE = 200


async def delete_user_events(engine: AsyncEngine, user_id: str, cutoff: datetime) -> None:
    """The user's events accepted at or before ``cutoff``."""
    t = score_events.c
    while True:
        async with engine.begin() as conn:
            result = await conn.execute(
                delete(score_events)
                .where(t.user_id == user_id, t.accepted_at <= to_db_time(cutoff))
                .execution_options(synchronize_session=False)
                .with_dialect_options(mysql_limit=DELETE_CHUNK)
            )
        if result.rowcount < DELETE_CHUNK:
            return


async def erase_from_snapshots(engine: AsyncEngine, user_id: str) -> None:
    """Stored snapshots holding the user, rewritten without its entries (the others keep the
    ranks they were taken with). Found by a text match on the stored JSON, escaped for LIKE,
    then checked entry by entry."""
    t = snapshots.c
    escaped = user_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    pattern = f'%"user_id":"{escaped}"%'
    after = 0
    while True:
        async with engine.begin() as conn:
            rows = (
                await conn.execute(
                    select(t.id, t.entries)
                    .where(t.id > after, t.entries.like(pattern))
                    .order_by(t.id)
                    .limit(SNAPSHOT_PAGE)
                )
            ).all()
            for row in rows:
                entries = orjson.loads(row.entries)
                kept = [e for e in entries if e.get("user_id") != user_id]
                if len(kept) != len(entries):
                    await conn.execute(
                        update(snapshots)
                        .where(t.id == row.id)
                        .values(entries=orjson.dumps(kept).decode())
                    )
        if len(rows) < SNAPSHOT_PAGE:
            return
        after = rows[-1].id


async def purge_board(engine: AsyncEngine, board_id: str, cutoff: datetime) -> None:
    """A deleted board's events and snapshots up to ``cutoff`` (a deletion with ``purge``)."""
    at = to_db_time(cutoff)
    for table, column in (
        (score_events, score_events.c.accepted_at),
        (snapshots, snapshots.c.taken_at),
    ):
        while True:
            async with engine.begin() as conn:
                result = await conn.execute(
                    delete(table)
                    .where(table.c.board_id == board_id, column <= at)
                    .with_dialect_options(mysql_limit=DELETE_CHUNK)
                )
            if result.rowcount < DELETE_CHUNK:
                break
