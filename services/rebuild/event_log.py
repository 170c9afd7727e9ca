"""The rebuild's reads of the event log (MySQL): a board's events in pages, and which of a set
of events it holds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from shared.db import after_deletion, score_events
from shared.keys import event_ref, parse_event_ref

PAGE = 2000  # events a MySQL page, and replays a Redis round trip
ID_CHUNK = 1000  # events an IN (...) lookup


@dataclass(frozen=True, slots=True)
class After:
    """Where a page of :func:`page` starts: after the event of primary key ``id``, whose outbox
    position was (``ms``, ``seq``), or none (``None``, ``None``: stored without one). The start
    of a board's events is ``After()``; of those with a position, ``POSITIONED``."""

    ms: int | None = None
    seq: int | None = None
    id: int = 0

    @classmethod
    def of(cls, row: Any) -> After:
        """The cursor after ``row``, the last of a page."""
        return cls(row.outbox_ms, row.outbox_seq, row.id)


POSITIONED = After(-1, -1, 0)  # before every position: a stream id's parts are never negative


def page(board_id: str, after: After) -> Any:
    """A page of the board's events after ``after``, in the order the board's writes were
    applied in: by their outbox position (the stream entry id the relay put in the event's
    message, which history stores), whichever relay published them and whatever order history
    stored them in. A cursor without a position pages only the events stored without one
    (before migration 0012), in the order the log stored them: the order they were applied in,
    for the events one relay published (see docs/reliability.md); :func:`pages` reads those
    first. Either is one range scan of the index on (board_id, outbox_ms, outbox_seq, id), a
    page, however far in. Each row has every field of the event's ``SubmitEvent``, the subscore
    and the metadata text included, and the periods its write put it in
    (:func:`services.rebuild.staging.replay_call`)."""
    t = score_events.c
    if after.ms is None:
        later: Any = and_(t.outbox_ms.is_(None), t.outbox_seq.is_(None), t.id > after.id)
    else:
        # (outbox_ms, outbox_seq, id) > after's, spelled out so that MySQL reads it as a range.
        later = or_(
            t.outbox_ms > after.ms,
            and_(
                t.outbox_ms == after.ms,
                or_(t.outbox_seq > after.seq, and_(t.outbox_seq == after.seq, t.id > after.id)),
            ),
        )
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
            t.outbox_ms,
            t.outbox_seq,
        )
        .where(t.board_id == board_id, later, after_deletion(t.accepted_at, board_id))
        # Without a position, by id alone (both are NULL throughout): MariaDB then reads the
        # index in its order rather than sorting what it found.
        .order_by(*((t.id,) if after.ms is None else (t.outbox_ms, t.outbox_seq, t.id)))
        .limit(PAGE)
    )


async def pages(conn: AsyncConnection, board_id: str) -> AsyncIterator[Sequence[Any]]:
    """Every page of the board's events (:func:`page`) in replay order: those stored without an
    outbox position first, then the others by position. A short page ends each part."""
    after = After()
    while True:
        rows = (await conn.execute(page(board_id, after))).all()
        if rows:
            yield rows
            after = After.of(rows[-1])
        if len(rows) < PAGE:
            if after.ms is not None:
                return
            after = POSITIONED


async def held(conn: AsyncConnection, board_id: str, refs: Iterable[str]) -> set[str]:
    """Which of the events ``refs`` names (``shared.keys.event_ref``: ``<event_id>:<user_id>``)
    the event log holds for the board as :func:`page` reads it. A bare event id (the newest
    event the write of the layout before noted, when ids were unique per board) is held if any
    user's event of that id is. The events a deleted board of the name kept are not the board's:
    the board made since may use their ids, and one of its events that MySQL does not hold yet
    would be taken for stored (the rebuild would not wait for it, nor replay it from the
    journal)."""
    wanted = sorted(refs)
    found: set[str] = set()
    t = score_events.c
    current = (t.board_epoch == 0, after_deletion(t.accepted_at, board_id))
    for start in range(0, len(wanted), ID_CHUNK):
        chunk = [parse_event_ref(ref) for ref in wanted[start : start + ID_CHUNK]]
        pairs = [(user, event) for event, user in chunk if user is not None]
        bare = [event for event, user in chunk if user is None]
        # Apart: (user_id, event_id) IN (...) is a range of the unique key's, which an OR with
        # a bare id's condition would turn into a scan of the board's entries in it.
        if pairs:
            rows = await conn.execute(
                select(t.event_id, t.user_id).where(
                    t.board_id == board_id, *current, tuple_(t.user_id, t.event_id).in_(pairs)
                )
            )
            found.update(event_ref(row.event_id, row.user_id) for row in rows)
        if bare:
            # At most one, once, after the upgrade: a scan of the board's index is fine.
            rows = await conn.execute(
                select(t.event_id).where(t.board_id == board_id, *current, t.event_id.in_(bare))
            )
            found.update(row.event_id for row in rows)
    return found
