"""The rebuild's reads of the event log (MySQL): a board's events in pages, and which of a set
of events it holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from shared.db import score_events

PAGE = 2000  # events a MySQL page, and replays a Redis round trip
ID_CHUNK = 1000  # event ids an IN (...) lookup


def page(board_id: str, after: int) -> Any:
    """A page of the board's events after primary key ``after``, in the order the log stored
    them: the order they were applied in, for the events one relay published (see
    docs/reliability.md). Each row has every field of the event's ``SubmitEvent``, the subscore
    and the metadata text included (:func:`services.rebuild.staging.replay_call`)."""
    t = score_events.c
    return (
        select(
            t.id,
            t.event_id,
            t.user_id,
            t.region,
            t.team_id,
            t.display_name,
            t.value,
            t.occurred_at,
            t.accepted_at,
            t.subscore,
            t.metadata,
        )
        .where(t.board_id == board_id, t.id > after)
        .order_by(t.id)
        .limit(PAGE)
    )


async def held(conn: AsyncConnection, board_id: str, event_ids: Iterable[str]) -> set[str]:
    """Which of ``event_ids`` the event log holds for the board."""
    wanted = sorted(event_ids)
    found: set[str] = set()
    t = score_events.c
    for start in range(0, len(wanted), ID_CHUNK):
        chunk = wanted[start : start + ID_CHUNK]
        rows = await conn.execute(
            select(t.event_id).where(t.board_id == board_id, t.event_id.in_(chunk))
        )
        found.update(row.event_id for row in rows)
    return found
