"""An erased user's rows of the event log deleted (docs/api.md section 8b), by whichever side
finds them: the erasure's passes (services/api/eraser.py), all of the user's up to its cut-off,
and the history consumer, those of a batch it stored while the erasure was being recorded
(services/history/handlers.py ``LateErasures``).
Deletes go in statements of ``DELETE_CHUNK`` rows, each its own transaction, so that none holds
MySQL's locks for long; deleting again deletes nothing.

No index of the event log begins with the user, and a statement on the user alone scans it
whole, locking every row it passes. The user's rows are found board by board instead, ranges of
the index on board, user and time (``board_id IN (...)``), the boards held read first by a loose
index scan (:func:`stored_boards`): the statements grow with the boards the log holds, not with
its rows, and lock the user's rows alone. docs/architecture.md ("Erasure and board deletion")
gives the figures, and why not an index on the user."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.db import score_events, to_db_time
from shared.events import ScoreAccepted

DELETE_CHUNK = 5000  # MySQL rows a DELETE statement


async def stored_boards(conn: AsyncConnection) -> list[str]:
    """Every board id the event log holds rows of, a deleted board's kept rows (``board_epoch``
    set) among them: a loose index scan (EXPLAIN: "Using index for group-by"), one dive into an
    index a board, whatever the rows."""
    return list(await conn.scalars(select(score_events.c.board_id).distinct()))


async def delete_user_events(engine: AsyncEngine, user_id: str, cutoff: datetime) -> None:
    """The user's events accepted at or before ``cutoff``, on every board the log holds, under
    whatever epoch."""
    async with engine.connect() as conn:
        boards = await stored_boards(conn)
    if not boards:
        return
    t = score_events.c
    while True:
        async with engine.begin() as conn:
            result = await conn.execute(
                delete(score_events)
                .where(
                    t.board_id.in_(boards),
                    t.user_id == user_id,
                    t.accepted_at <= to_db_time(cutoff),
                )
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
