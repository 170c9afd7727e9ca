"""The event counters' side of a user's erasure, for the worker in :mod:`services.api.eraser`:
the user's events are taken out of the counters (``stats``) they were counted in, each once, and
only those the aggregator's derive step counted (docs/api.md section 8b).

An event is counted once the derive step applied it, which clears its record's derive-pending
bit. So an event of the user with a record that tells its periods is taken out by that record
(``ladder_uncount_events_v1``, :func:`shared.uncount.uncount_events`): only if the bit is clear,
and the record deleted in the same step, so that a pass again, after a crash or as the second
one, takes nothing twice. The history consumer, which leaves out an erased user's events still
in its queue, goes by the same records while they last (:class:`shared.uncount.Uncount`): it sets
the bit of what it took out, and the pass then takes nothing of it. An event stored in the
history database with no such record (it expired, the event older than the idempotency TTL, or
is of the consumers' marks alone) is taken out by its row, as counted (the safe side: a rebuild
refuses a board whose live counter is above what the database gives), before its row is deleted:
out of the periods its write put it in, which the row keeps (or, for a row stored before it
did, the board's periods at its ``occurred_at``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.api.write.submit import response_from_record
from shared.boards import Board
from shared.db import from_db_time, score_events, to_db_time
from shared.erased_events import delete_user_events
from shared.events import parse_period_ids
from shared.keys import Keys, parse_event_ref
from shared.periods import window_at
from shared.uncount import uncount, uncount_events


def periods_told(stored: str | None) -> list[tuple[str, str]] | None:
    """The (period, period_id) pairs an event's record answers with (shared/lua/write.lua: a
    marks byte, ``@`` to ``G``, the body hash in 16 digits, then the answer); None for a record
    that tells none: no record, one of marks alone, one of the layout before (a hex digit first)."""
    if stored is None or len(stored) <= 1 or not "@" <= stored[0] <= "G":
        return None
    answer = response_from_record(stored[17:], "", "", "", "")
    return sorted((name, period["period_id"]) for name, period in answer["periods"].items())


def row_periods(board: Board, row: Any) -> list[tuple[str, str]]:
    """The (period, period_id) pairs a stored event was counted in: those its write put it in,
    which the event log keeps; for an event stored before it kept them (NULL), the board's
    periods at its ``occurred_at``, worked out as the write does."""
    if row.periods is not None:
        return list(parse_period_ids(row.periods))
    occurred = from_db_time(row.occurred_at)
    return [
        (period, window_at(period, occurred, board.timezone, board.schedule).period_id)
        for period in board.periods
    ]


async def take_out_events(
    engine: AsyncEngine,
    redis: Redis,
    keys: Keys,
    boards: Mapping[str, Board],
    user_id: str,
    cutoff: datetime,
    records: list[str],
) -> None:
    """The user's events (accepted by ``cutoff``) out of the counters and out of MySQL, then its
    ``records`` (its event records on every board, found by the pass's scan) deleted."""
    head = "{" + f"{keys.prefix}:"
    # Each board's records with the periods each tells ((period, period_id)...; none: it tells
    # none, and the event's row counts it if it is stored).
    by_board: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {}
    told: set[tuple[str, str]] = set()
    async with redis.pipeline(transaction=False) as pipe:  # each alone: they lie in many slots
        for record in records:
            pipe.get(record)
        values: list[str | None] = await pipe.execute()
    for record, value in zip(records, values, strict=True):
        board_id, _, ref = record[len(head) :].partition("}:idem:")
        periods = periods_told(value) if board_id in boards else None
        if periods is not None:
            told.add((board_id, parse_event_ref(ref)[0]))
        by_board.setdefault(board_id, []).append((record, periods or []))
    t = score_events.c
    counts: dict[str, dict[tuple[str, str], int]] = {}
    async with engine.connect() as conn:
        rows = await conn.execute(
            # A deleted board's kept events (board_epoch set) were counted on no live board.
            # The live boards name the ranges of the index on board, user and time to read
            # (shared/erased_events.py says why not the user alone).
            select(t.board_id, t.event_id, t.occurred_at, t.periods).where(
                t.board_id.in_(list(boards)),
                t.user_id == user_id,
                t.accepted_at <= to_db_time(cutoff),
                t.board_epoch == 0,
            )
        )
        for row in rows:
            board = boards.get(row.board_id)
            if board is None or (row.board_id, row.event_id) in told:
                continue
            per_board = counts.setdefault(board.board_id, {})
            for named in row_periods(board, row):
                per_board[named] = per_board.get(named, 0) + 1
    for board_id, per_board in counts.items():
        await uncount(redis, keys, board_id, per_board)
    # Rows before records: a crash between them leaves records, which the next pass takes.
    await delete_user_events(engine, user_id, cutoff)
    for board_id, found in by_board.items():
        await uncount_events(redis, keys, board_id, found, drop=True)
