"""The history database's side of an erasure (its snapshots; its events' rows are
shared/erased_events.py's) and of a board's purge (docs/api.md section 8b), for the worker in
:mod:`services.api.eraser`: deletes go in statements of ``DELETE_CHUNK`` rows, each its own
transaction, so that none holds MySQL's locks for long; every step is idempotent."""

from __future__ import annotations

import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import board_epoch_of, score_events, snapshot_users, snapshots, to_db_time
from shared.db_boards import SNAPSHOT_DELETE_CHUNK
from shared.erased_events import DELETE_CHUNK
from shared.erasure import BoardDeletion

SNAPSHOT_PAGE = 200


async def erase_from_snapshots(engine: AsyncEngine, user_id: str) -> None:
    """Stored snapshots holding the user, rewritten without its entries (the others keep the
    ranks they were taken with), a page at a time: found by ``snapshot_users``' key, whose rows
    of the user go with the rewrite, in its transaction."""
    t, u = snapshots.c, snapshot_users.c
    while True:
        async with engine.begin() as conn:
            page = (
                select(u.snapshot_id)
                .where(u.user_id == user_id)
                .order_by(u.snapshot_id)
                .limit(SNAPSHOT_PAGE)
            )
            ids = list((await conn.execute(page)).scalars())
            if not ids:
                return
            rows = (await conn.execute(select(t.id, t.entries).where(t.id.in_(ids)))).all()
            for row in rows:
                entries = orjson.loads(row.entries)
                kept = [e for e in entries if e.get("user_id") != user_id]
                if len(kept) != len(entries):
                    await conn.execute(
                        update(snapshots)
                        .where(t.id == row.id)
                        .values(entries=orjson.dumps(kept).decode())
                    )
            gone = delete(snapshot_users).where(u.user_id == user_id, u.snapshot_id.in_(ids))
            await conn.execute(gone)
        if len(ids) < SNAPSHOT_PAGE:
            return


async def purge_board(engine: AsyncEngine, deletion: BoardDeletion) -> None:
    """A deleted board's own events and snapshots up to its cut-off (a deletion with ``purge``).

    An earlier board of the name, deleted without purge, keeps its history beside it: its
    events under its deletion's epoch (shared/erasure.py ``finish_board_deletion``), its
    snapshots taken up to that deletion's cut-off. This board's events are those of epoch 0
    (not set apart yet) and of this deletion's own epoch (an event stored after the deletion
    was recorded, services/history/handlers.py); its snapshots those taken after the cut-off
    before."""
    at = to_db_time(deletion.cutoff)
    e, s = score_events.c, snapshots.c
    own_events = (
        e.board_id == deletion.board_id,
        e.board_epoch.in_([0, board_epoch_of(deletion.cutoff)]),
        e.accepted_at <= at,
    )
    own_snapshots = [s.board_id == deletion.board_id, s.taken_at <= at]
    if deletion.previous_cutoff is not None:
        own_snapshots.append(s.taken_at > to_db_time(deletion.previous_cutoff))
    steps = (
        (score_events, own_events, DELETE_CHUNK),
        (snapshots, tuple(own_snapshots), SNAPSHOT_DELETE_CHUNK),
    )
    for table, own, chunk in steps:
        while True:
            async with engine.begin() as conn:
                result = await conn.execute(
                    delete(table).where(*own).with_dialect_options(mysql_limit=chunk)
                )
            if result.rowcount < chunk:
                break
