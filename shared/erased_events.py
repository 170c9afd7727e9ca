"""An erased user's rows of the event log deleted (docs/api.md section 8b), by whichever side
finds them: the erasure's passes (services/api/eraser.py), all of the user's up to its cut-off,
and the history consumer, those of a batch it stored while the erasure was being recorded
(services/history/handlers.py ``LateErasures``).
Deletes go in statements of ``DELETE_CHUNK`` rows, each its own transaction, so that none holds
MySQL's locks for long; deleting again deletes nothing."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import score_events, to_db_time
from shared.events import ScoreAccepted

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


async def delete_stored(engine: AsyncEngine, events: Iterable[ScoreAccepted]) -> int:
    """The rows of ``events``, whatever their board's epoch, in one transaction: a statement a
    board and user (the index on board, user and time finds them). Returns rows deleted."""
    ids: dict[tuple[str, str], list[str]] = defaultdict(list)
    for event in events:
        ids[(event.board_id, event.user_id)].append(event.event_id)
    t, deleted = score_events.c, 0
    async with engine.begin() as conn:
        for (board_id, user_id), event_ids in sorted(ids.items()):
            result = await conn.execute(
                delete(score_events)
                .where(t.board_id == board_id, t.user_id == user_id, t.event_id.in_(event_ids))
                .execution_options(synchronize_session=False)
            )
            deleted += result.rowcount
    return deleted
