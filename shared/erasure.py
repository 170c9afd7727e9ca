"""Erased users and deleted boards (docs/api.md section 8b): their records in the history
database, the Redis projections every consumer reads, and the filter that keeps their events out.

An erasure is recorded as a tombstone keyed by :func:`user_hash`, an HMAC-SHA-256 of the user id
under a key derived from ``LADDER_JWT_SECRET``, so that the table names nobody: a plain SHA-256
of a guessable id (``u-42``) could be confirmed by anyone holding the database, the keyed hash
only by someone who also holds the deployment's secret. The user id itself is kept beside it
only while the erasure is pending (the worker needs it), and set to NULL once it is done.

Each tombstone and each board deletion has a *cut-off*: the events of the user (of the board)
accepted at or before it belong to the erased user (the deleted board). Every consumer drops
them (:class:`Tombstones`, :func:`skipping`), the rebuild skips them, and the history reads of a
fresh board of the same name start after it: so an event still in a queue or an outbox when the
erasure was asked for does not bring the user (or the old board) back. An event accepted after
the cut-off is a fresh board's; the user's writes wait from the request until its erasure is
done (services/api/erasing.py), so that none accepted after the cut-off meets the worker's pass.
The cut-off lies a few seconds after the request (``USER_SETTLE_SECONDS``,
``BOARD_SETTLE_SECONDS``), and the worker's second pass comes after it, so whatever was accepted
while the erasure ran is covered too (services/api/eraser.py).

MySQL is the source of truth of both tables; ``Keys.erased`` and ``Keys.deleted_boards`` are
their projections, written after MySQL, restored by the API at start-up and by the rebuild.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import Counter
from redis.asyncio import Redis
from sqlalchemy import delete, select, update
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.consumer import Handler
from shared.db import (
    board_deletions,
    board_epoch_of,
    erasures,
    from_db_time,
    hidden_users,
    score_events,
    to_db_time,
)
from shared.events import ScoreAccepted
from shared.keys import Keys

SKIPPED = Counter(
    "ladder_erased_events_skipped_total",
    "Events of erased users or deleted boards that a consumer left out",
    ["consumer"],
)

USER_SETTLE_SECONDS = 2.0
"""How long after an erasure request its cut-off lies: events accepted meanwhile are erased too,
and the worker's second pass comes after it."""
BOARD_SETTLE_SECONDS = 6.0
"""The same for a board deletion: longer than an API process keeps a definition cached
(:class:`shared.boards.BoardCatalog`, 5 s), so that no process accepts a write of the deleted
board after its cut-off."""
EPOCH_CHUNK = 5000
"""Rows a statement sets apart as a deleted board's (finish_board_deletion)."""


def user_hash(user_id: str, secret: str) -> str:
    """The tombstone's key of ``user_id``: HMAC-SHA-256 (hex) under a key derived from the
    deployment's ``secret`` (``LADDER_JWT_SECRET``), so that it is of no use for this alone."""
    key = hashlib.sha256(b"ladder-erasure\0" + secret.encode()).digest()
    return hmac.new(key, user_id.encode(), hashlib.sha256).hexdigest()


def to_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _ms_of(moment: datetime) -> int:
    # accepted_at is aware; a naive one from MySQL is UTC.
    return to_ms(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


# -- the filter the consumers run ---------------------------------------------------------------


# A batch as a filter splits it: the events a consumer handles, and those left out for a user's
# erasure alone (see skipping).
Split = tuple[list[ScoreAccepted], list[ScoreAccepted]]


class Tombstones:
    """Which events belong to an erased user or a deleted board, read from the Redis projections
    (one round trip a batch: the batch's distinct users and boards)."""

    def __init__(self, redis: Redis, keys: Keys, secret: str) -> None:
        self._redis = redis
        self._keys = keys
        self._secret = secret

    async def cutoffs(
        self, events: Sequence[ScoreAccepted]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """The cut-offs (ms) of the batch's erased users (by user id) and deleted boards."""
        users = sorted({e.user_id for e in events})
        boards = sorted({e.board_id for e in events})
        hashes = [user_hash(u, self._secret) for u in users]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._keys.erased, hashes)
            pipe.hmget(self._keys.deleted_boards, boards)
            by_user, by_board = await pipe.execute()
        return (
            {u: int(c) for u, c in zip(users, by_user, strict=True) if c is not None},
            {b: int(c) for b, c in zip(boards, by_board, strict=True) if c is not None},
        )

    async def split(self, events: list[ScoreAccepted]) -> Split:
        """``events`` without those of erased users and deleted boards; and those left out for a
        user's erasure alone."""
        if not events:
            return events, []
        users, boards = await self.cutoffs(events)
        if not users and not boards:
            return events, []
        return _split(events, users, boards, set(boards))


def _split(
    events: list[ScoreAccepted],
    users: dict[str, int],
    boards: dict[str, int],
    leaving: set[str],
) -> Split:
    """``events`` without those of erased users and of the deleted boards in ``leaving``; and
    those left out for a user's erasure whose board was not deleted at them. An event of a
    deleted board has nothing to take back: the board's counters and views went with its keys,
    and a board made since under its name, whose records may bear the same ids, is another."""
    kept: list[ScoreAccepted] = []
    erased: list[ScoreAccepted] = []
    for event in events:
        at = _ms_of(event.accepted_at)
        user, board = users.get(event.user_id), boards.get(event.board_id)
        of_deleted_board = board is not None and at <= board
        if user is not None and at <= user:
            if not of_deleted_board:
                erased.append(event)
        elif not (of_deleted_board and event.board_id in leaving):
            kept.append(event)
    return kept, erased


class StoredTombstones:
    """:class:`Tombstones` read from MySQL itself, for the history consumer: the event log must
    stay right even while Redis has lost its projections. ``purged_only`` (the event log): a
    deleted board's events are left out only when its deletion purges its history, which stays
    otherwise; without it, whatever the purge (the marks of its views, whose keys went)."""

    def __init__(self, engine: AsyncEngine, secret: str, *, purged_only: bool = True) -> None:
        self._engine = engine
        self._secret = secret
        self._purged_only = purged_only

    async def split(self, events: list[ScoreAccepted]) -> Split:
        if not events:
            return events, []
        users = sorted({e.user_id for e in events})
        async with self._engine.connect() as conn:
            erased = await stored_tombstones(conn, users, self._secret)
            t = board_deletions.c
            ids = sorted({e.board_id for e in events})
            query = select(t.board_id, t.cutoff, t.purge).where(t.board_id.in_(ids))
            rows = (await conn.execute(query)).all()
        if not erased and not rows:
            return events, []
        boards = {row.board_id: to_ms(from_db_time(row.cutoff)) for row in rows}
        leaving = {row.board_id for row in rows if row.purge or not self._purged_only}
        return _split(events, erased, boards, leaving)


def skipping(
    consumer: str,
    tombstones: Tombstones | StoredTombstones,
    handler: Handler,
    on_dropped: Handler | None = None,
) -> Handler:
    """``handler`` given each batch without the events of erased users and deleted boards;
    ``on_dropped`` given those left out for a user's erasure (the history consumer's
    :class:`Uncount`, the aggregator's pair sync), and never a deleted board's: what those
    take back went with the board's keys, and a board made since under its name is another."""

    async def handle(events: list[ScoreAccepted]) -> None:
        kept, erased = await tombstones.split(events)
        if len(kept) != len(events):
            SKIPPED.labels(consumer).inc(len(events) - len(kept))
        if on_dropped is not None and erased:
            await on_dropped(erased)
        if kept:
            await handler(kept)

    return handle


async def stored_tombstones(
    conn: AsyncConnection, user_ids: Iterable[str], secret: str
) -> dict[str, int]:
    """The cut-offs (ms) of those of ``user_ids`` that are erased, by user id, from MySQL."""
    by_hash = {user_hash(u, secret): u for u in user_ids}
    if not by_hash:
        return {}
    t = erasures.c
    rows = await conn.execute(select(t.user_hash, t.cutoff).where(t.user_hash.in_(list(by_hash))))
    return {by_hash[row.user_hash]: to_ms(from_db_time(row.cutoff)) for row in rows}


# -- the records in MySQL -----------------------------------------------------------------------


@dataclass(frozen=True)
class Erasure:
    """A tombstone as stored: ``user_id`` is None once the erasure is done."""

    user_hash: str
    user_id: str | None
    cutoff: datetime
    done_at: datetime | None


@dataclass(frozen=True)
class BoardDeletion:
    """A board's deletion as stored; ``previous_cutoff`` is that of the deletion of an earlier
    board of the name (None for a name's first), up to which the snapshots are that board's."""

    board_id: str
    cutoff: datetime
    purge: bool
    done_at: datetime | None
    previous_cutoff: datetime | None = None


async def request_erasure(
    engine: AsyncEngine, redis: Redis, keys: Keys, user_id: str, secret: str
) -> Erasure:
    """Record the erasure of ``user_id`` (MySQL first, then the Redis projection), pending; an
    erasure asked again moves the cut-off forward and runs again."""
    now = datetime.now(UTC)
    cutoff = now + timedelta(seconds=USER_SETTLE_SECONDS)
    digest = user_hash(user_id, secret)
    statement = insert(erasures).values(
        user_hash=digest, user_id=user_id, cutoff=to_db_time(cutoff), done_at=None
    )
    statement = statement.on_duplicate_key_update(
        user_id=statement.inserted.user_id, cutoff=statement.inserted.cutoff, done_at=None
    )
    async with engine.begin() as conn:
        await conn.execute(statement)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(keys.erased, digest, to_ms(cutoff))
        pipe.hset(keys.erasing, digest, to_ms(cutoff))  # its writes wait (services/api/erasing.py)
        await pipe.execute()
    return Erasure(digest, user_id, cutoff, None)


async def erasure_of(engine: AsyncEngine, user_id: str, secret: str) -> Erasure | None:
    t = erasures.c
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(erasures).where(t.user_hash == user_hash(user_id, secret)))
        ).first()
    return None if row is None else _erasure(row)


def _erasure(row: Any) -> Erasure:
    done = None if row.done_at is None else from_db_time(row.done_at)
    return Erasure(row.user_hash, row.user_id, from_db_time(row.cutoff), done)


async def pending_erasures(engine: AsyncEngine) -> list[Erasure]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(erasures).where(erasures.c.done_at.is_(None)))
        return [_erasure(row) for row in rows]


async def finish_erasure(engine: AsyncEngine, erasure: Erasure) -> None:
    """Mark the erasure done and forget the user id (the tombstone keeps its hash alone), unless
    it was asked again meanwhile (a later cut-off: it runs again)."""
    t = erasures.c
    async with engine.begin() as conn:
        await conn.execute(
            update(erasures)
            .where(t.user_hash == erasure.user_hash, t.cutoff == to_db_time(erasure.cutoff))
            .values(done_at=to_db_time(datetime.now(UTC)), user_id=None)
        )


async def record_board_deletion(conn: AsyncConnection, board_id: str, purge: bool) -> BoardDeletion:
    """Record a board's deletion, pending (in the caller's transaction: committed with it). The
    name's row holds its last deletion: the cut-off of the one before, done, is read first and
    kept beside the new one, so that a purge leaves the snapshots of the earlier board."""
    cutoff = datetime.now(UTC) + timedelta(seconds=BOARD_SETTLE_SECONDS)
    before = await board_deletion_of(conn, board_id)
    previous = None
    if before is not None:
        previous = before.cutoff if before.done_at is not None else before.previous_cutoff
    statement = insert(board_deletions).values(
        board_id=board_id,
        cutoff=to_db_time(cutoff),
        purge=purge,
        done_at=None,
        previous_cutoff=None if previous is None else to_db_time(previous),
    )
    statement = statement.on_duplicate_key_update(
        cutoff=statement.inserted.cutoff,
        purge=statement.inserted.purge,
        done_at=None,
        previous_cutoff=statement.inserted.previous_cutoff,
    )
    await conn.execute(statement)
    return BoardDeletion(board_id, cutoff, purge, None, previous)


def _deletion(row: Any) -> BoardDeletion:
    done = None if row.done_at is None else from_db_time(row.done_at)
    previous = None if row.previous_cutoff is None else from_db_time(row.previous_cutoff)
    return BoardDeletion(row.board_id, from_db_time(row.cutoff), bool(row.purge), done, previous)


async def board_deletion_of(
    db: AsyncEngine | AsyncConnection, board_id: str
) -> BoardDeletion | None:
    query = select(board_deletions).where(board_deletions.c.board_id == board_id)
    if isinstance(db, AsyncConnection):
        row = (await db.execute(query)).first()
    else:
        async with db.connect() as conn:
            row = (await conn.execute(query)).first()
    return None if row is None else _deletion(row)


async def pending_board_deletions(engine: AsyncEngine) -> list[BoardDeletion]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(board_deletions).where(board_deletions.c.done_at.is_(None))
        )
        return [_deletion(row) for row in rows]


async def finish_board_deletion(engine: AsyncEngine, deletion: BoardDeletion) -> None:
    """Mark the deletion done: the events the board keeps (a deletion without purge) set apart
    by its epoch, so that a board made later under the name may use the same event ids, and its
    hidden users dropped (a rebuild would hide them on the new board)."""
    epoch = board_epoch_of(deletion.cutoff)
    e = score_events.c
    old = (
        e.board_id == deletion.board_id,
        e.board_epoch == 0,
        e.accepted_at <= to_db_time(deletion.cutoff),
    )
    while True:  # in statements of a bounded size, each its own transaction
        async with engine.begin() as conn:
            moved = await conn.execute(
                update(score_events)
                .where(*old)
                .values(board_epoch=epoch)
                .prefix_with("IGNORE")
                .with_dialect_options(mysql_limit=EPOCH_CHUNK)
            )
        if moved.rowcount < EPOCH_CHUNK:
            break
    # What IGNORE left: events the history consumer stored again under the epoch already (a
    # redelivery after the deletion was recorded), each a copy of a row that now has it.
    async with engine.begin() as conn:
        await conn.execute(delete(score_events).where(*old))
    t = board_deletions.c
    async with engine.begin() as conn:
        await conn.execute(delete(hidden_users).where(hidden_users.c.board_id == deletion.board_id))
        await conn.execute(
            update(board_deletions)
            .where(t.board_id == deletion.board_id, t.cutoff == to_db_time(deletion.cutoff))
            .values(done_at=to_db_time(datetime.now(UTC)))
        )


async def restore_projections(engine: AsyncEngine, redis: Redis, keys: Keys) -> int:
    """Write every tombstone's and board deletion's cut-off into Redis (a Redis that lost them
    would let an event still in flight through). Returns how many were written."""
    written = 0
    async with engine.connect() as conn:
        tombs = (await conn.execute(select(erasures.c.user_hash, erasures.c.cutoff))).all()
        boards = (
            await conn.execute(select(board_deletions.c.board_id, board_deletions.c.cutoff))
        ).all()
    for key, rows in ((keys.erased, tombs), (keys.deleted_boards, boards)):
        for start in range(0, len(rows), 1000):
            chunk = rows[start : start + 1000]
            await redis.hset(key, mapping={r[0]: to_ms(from_db_time(r[1])) for r in chunk})
            written += len(chunk)
    return written
