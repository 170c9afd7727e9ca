"""The rebuild's reads of the event log (MySQL): a board's events in pages, and which of a set
of events it holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from shared.db import after_deletion, score_events
from shared.keys import event_ref, parse_event_ref

PAGE = 2000  # events a MySQL page, and replays a Redis round trip
ID_CHUNK = 1000  # events an IN (...) lookup


def page(board_id: str, after: int) -> Any:
    """A page of the board's events after primary key ``after``, in the order the log stored
    them: the order they were applied in, for the events one relay published (see
    docs/reliability.md). Each row has every field of the event's ``SubmitEvent``, the subscore
    and the metadata text included, and the periods its write put it in
    (:func:`services.rebuild.staging.replay_call`)."""
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
            t.periods,
        )
        .where(t.board_id == board_id, t.id > after, after_deletion(t.accepted_at, board_id))
        .order_by(t.id)
        .limit(PAGE)
    )


async def held(conn: AsyncConnection, board_id: str, refs: Iterable[str]) -> set[str]:
    """Which of the events ``refs`` names (``shared.keys.event_ref``: ``<event_id>:<user_id>``)
    the event log holds for the board. A bare event id (the newest event the write of the layout
    before noted, when ids were unique per board) is held if any user's event of that id is."""
    wanted = sorted(refs)
    found: set[str] = set()
    t = score_events.c
    for start in range(0, len(wanted), ID_CHUNK):
        chunk = [parse_event_ref(ref) for ref in wanted[start : start + ID_CHUNK]]
        pairs = [(user, event) for event, user in chunk if user is not None]
        bare = [event for event, user in chunk if user is None]
        # Apart: (user_id, event_id) IN (...) is a range of the unique key's, which an OR with
        # a bare id's condition would turn into a scan of the board's entries in it.
        if pairs:
            rows = await conn.execute(
                select(t.event_id, t.user_id).where(
                    t.board_id == board_id, tuple_(t.user_id, t.event_id).in_(pairs)
                )
            )
            found.update(event_ref(row.event_id, row.user_id) for row in rows)
        if bare:
            # At most one, once, after the upgrade: a scan of the board's index is fine.
            rows = await conn.execute(
                select(t.event_id).where(t.board_id == board_id, t.event_id.in_(bare))
            )
            found.update(row.event_id for row in rows)
    return found
