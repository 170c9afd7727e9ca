"""An erased user's rows of the event log deleted (docs/api.md section 8b), by whichever side
finds them: the erasure's passes (services/api/eraser.py), and the history consumer for a batch
it stored while the erasure was being recorded (services/history/handlers.py ``LateErasures``).
Deletes go in statements of ``DELETE_CHUNK`` rows, each its own transaction, so that none holds
MySQL's locks for long; deleting again deletes nothing."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import score_events, to_db_time

DELETE_CHUNK = 5000  # MySQL rows a DELETE statement


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
