"""Board definitions and snapshots in the history database (friendships: shared.friendships).

MySQL is the source of truth of both; Redis holds a projection of the first (the hash
``Keys.boards``) that the API restores at start-up. Every write
here lands in MySQL before its caller touches Redis, so Redis is never ahead of MySQL.

Board definition writes are rare and go through :func:`definitions_lock`, a MySQL named lock per
database: a ``PUT`` and the API's start-up restore each read MySQL, write it, and write Redis
under it, so that concurrent writers reach Redis in the order they reached MySQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import literal, select, tuple_
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from typing_extensions import TypedDict

from shared import db_locks
from shared.boards import Board
from shared.db import (
    after_deletion,
    boards,
    from_db_time,
    score_events,
    snapshot_users,
    snapshots,
    to_db_time,
)
from shared.db_locks import named_locks
from shared.events import rfc3339

LOCK_TIMEOUT_SECONDS = 10
# Snapshot rows a statement, and their entries' bytes: one INSERT stays well under MariaDB's
# default 16 MiB max_allowed_packet. A row without metadata is at most ~110 KiB (1000 entries),
# so fifty fit; with metadata (up to 1 KiB an entry, twice that escaped) a row may near 3 MiB,
# and the byte budget cuts the statement short first.
SNAPSHOT_CHUNK = 50
SNAPSHOT_CHUNK_BYTES = 4 * 1024 * 1024
# Snapshots a DELETE statement (a purge, the retention): each takes its rows of
# ``snapshot_users`` with it, 100 at the default size, so that a statement deletes about 5,000.
SNAPSHOT_DELETE_CHUNK = 50
# Rows of ``snapshot_users`` a statement (50 snapshots of 1,000 entries make 50,000).
USERS_CHUNK = 5000
USERS_INSERT = f"INSERT IGNORE INTO {snapshot_users.name} (user_id, snapshot_id) VALUES (%s, %s)"

Db = AsyncEngine | AsyncConnection


class LockTimeout(db_locks.LockTimeout):
    """Another process held the board definitions lock for too long."""


class SnapshotRow(TypedDict):
    """A snapshot to store: the top entries of one view at ``taken_at`` (aware)."""

    board_id: str
    scope: str
    period: str
    period_id: str
    taken_at: datetime
    entries: list[dict[str, Any]]


class SnapshotRecord(TypedDict):
    """A stored snapshot as the API shows it (docs/api.md section 7)."""

    board_id: str
    scope: str
    period: str
    period_id: str
    taken_at: str
    entries: list[dict[str, Any]]


@contextlib.asynccontextmanager
async def _unit(db: Db) -> AsyncIterator[AsyncConnection]:
    """One transaction: on an engine, a connection of its own; on a connection, committed (or
    rolled back) when the block ends, so that the next read sees what others committed."""
    if isinstance(db, AsyncEngine):
        async with db.begin() as conn:
            yield conn
        return
    try:
        yield db
    except BaseException:
        await db.rollback()
        raise
    await db.commit()


# -- board definitions -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def definitions_lock(
    engine: AsyncEngine, wait_seconds: float = LOCK_TIMEOUT_SECONDS
) -> AsyncIterator[AsyncConnection]:
    """A connection holding the board definitions lock of this database for the block.

    Raises :class:`LockTimeout` if the lock is not had within ``wait_seconds``.
    """
    name = f"ladder.boards.{engine.url.database}"[:64]
    refusal = LockTimeout("another process is changing board definitions")
    async with named_locks(engine, [name], wait_seconds, refusal) as conn:
        yield conn


async def load_boards(db: Db) -> list[Board]:
    """Every stored definition, by board id."""
    async with _unit(db) as conn:
        rows = (await conn.execute(select(boards.c.definition).order_by(boards.c.board_id))).all()
    return [Board.model_validate_json(row.definition) for row in rows]


async def load_board(db: Db, board_id: str) -> Board | None:
    async with _unit(db) as conn:
        found = await conn.scalar(select(boards.c.definition).where(boards.c.board_id == board_id))
    return None if found is None else Board.model_validate_json(found)


async def save_board(db: Db, board: Board, *, replace: bool = True) -> None:
    """Store ``board``, replacing its definition (or, with ``replace=False``, only if none is
    stored yet). Committed when this returns."""
    now = to_db_time(datetime.now(UTC))
    statement = insert(boards).values(
        board_id=board.board_id,
        definition=board.model_dump_json(),
        created_at=now,
        updated_at=now,
    )
    if replace:
        statement = statement.on_duplicate_key_update(
            definition=statement.inserted.definition, updated_at=statement.inserted.updated_at
        )
    else:
        statement = statement.on_duplicate_key_update(board_id=boards.c.board_id)
    async with _unit(db) as conn:
        await conn.execute(statement)


async def has_events(db: Db, board_id: str) -> bool:
    """Whether the event log holds any event of the board (one index probe, not a count)."""
    t = score_events.c
    query = (
        select(literal(1))
        .where(t.board_id == board_id, after_deletion(t.accepted_at, board_id))
        .limit(1)
    )
    async with _unit(db) as conn:
        return await conn.scalar(query) is not None


# -- snapshots ---------------------------------------------------------------------------------


def _to_millisecond(moment: datetime) -> datetime:
    # Times are shown to the millisecond: a client that asks for a snapshot "at" the taken_at it
    # was shown must find it, so no more precision is stored than is shown.
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


async def save_snapshots(engine: AsyncEngine, rows: list[SnapshotRow]) -> int:
    """Store snapshots, a few rows a statement, in one transaction; how many were stored. A
    snapshot of a view stored already under the same ``taken_at`` (the time its set was taken:
    another pass of the same take stored it) is not stored again: the table's unique key, with
    ``ON DUPLICATE KEY UPDATE id = id`` (as the event log's; an engine made with
    ``changed_rows=True`` counts such a row out of the number returned). The users each holds
    go to ``snapshot_users`` in the same transaction."""
    if not rows:
        return 0
    values = [
        {
            "board_id": row["board_id"],
            "scope": row["scope"],
            "period": row["period"],
            "period_id": row["period_id"],
            "taken_at": to_db_time(_to_millisecond(row["taken_at"])),
            "entries": orjson.dumps(row["entries"]).decode(),
        }
        for row in rows
    ]
    # The users each snapshot holds (a team's entries hold none), by the snapshot's key.
    holders = {
        _key_of(value): [e["user_id"] for e in row["entries"] if isinstance(e.get("user_id"), str)]
        for row, value in zip(rows, values, strict=True)
    }
    stored = 0
    async with engine.begin() as conn:
        for chunk in _snapshot_chunks(values):
            statement = insert(snapshots).values(chunk)
            result = await conn.execute(statement.on_duplicate_key_update(id=snapshots.c.id))
            stored += result.rowcount
            await _index_users(conn, [_key_of(value) for value in chunk], holders)
    return stored


# The columns of the snapshots' unique key: a view and the time its set was taken.
_KEY = (
    snapshots.c.board_id,
    snapshots.c.scope,
    snapshots.c.period,
    snapshots.c.period_id,
    snapshots.c.taken_at,
)


def _key_of(value: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(value[column.name] for column in _KEY)


async def _index_users(
    conn: AsyncConnection, named: list[tuple[Any, ...]], holders: dict[tuple[Any, ...], list[str]]
) -> None:
    """The users of the snapshots ``named`` by their keys (stored just now, or before under the
    same key), a row each in ``snapshot_users``; rows there already are left as they are."""
    found = await conn.execute(select(snapshots.c.id, *_KEY).where(tuple_(*_KEY).in_(named)))
    ids = {tuple(row[1:]): row[0] for row in found}
    users = [(user, ids[key]) for key in named if key in ids for user in holders[key]]
    # The driver's executemany: one multi-row statement, without SQLAlchemy compiling a bound
    # parameter a value (which took most of a pass's time).
    for at in range(0, len(users), USERS_CHUNK):
        await conn.exec_driver_sql(USERS_INSERT, users[at : at + USERS_CHUNK])


def _snapshot_chunks(values: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """``values`` cut into statements of at most ``SNAPSHOT_CHUNK`` rows and
    ``SNAPSHOT_CHUNK_BYTES`` of entries (UTF-8), a row larger than that alone in its own."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for value in values:
        row_size = len(value["entries"].encode())
        if chunk and (len(chunk) == SNAPSHOT_CHUNK or size + row_size > SNAPSHOT_CHUNK_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(value)
        size += row_size
    if chunk:
        yield chunk


async def snapshot_at(
    engine: AsyncEngine,
    board_id: str,
    scope: str,
    period: str,
    at: datetime,
    period_id: str | None = None,
) -> SnapshotRecord | None:
    """The newest snapshot of a view taken at or before ``at`` (aware), of any period id unless
    ``period_id`` names one; ``None`` if none was taken by then.

    One backward range scan of an index: of any period id, the view's index by time; of one,
    the unique key (the view, the period id, the time), ordered by the time alone, which the
    key keeps unique within a period id. Ordered by the id as well, the key could not give the
    order, and MySQL took the index by time instead, walking back over every snapshot of the
    view taken after the period's: with 50,000 of them, a public read of an old period id
    took 3.6 s."""
    t = snapshots.c
    query = (
        select(t.period_id, t.taken_at, t.entries)
        .where(
            t.board_id == board_id,
            t.scope == scope,
            t.period == period,
            t.taken_at <= to_db_time(at),
            after_deletion(t.taken_at, board_id),
        )
        .limit(1)
    )
    if period_id is None:
        query = query.order_by(t.taken_at.desc(), t.id.desc())
    else:
        query = query.where(t.period_id == period_id).order_by(t.taken_at.desc())
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        return None
    return {
        "board_id": board_id,
        "scope": scope,
        "period": period,
        "period_id": row.period_id,
        "taken_at": rfc3339(from_db_time(row.taken_at)),
        "entries": [_with_metadata(entry) for entry in orjson.loads(row.entries)],
    }


def _with_metadata(entry: dict[str, Any]) -> dict[str, Any]:
    """A stored entry with its ``metadata``: entries taken before metadata was kept have none,
    and every entry a read answers has the field (null when none)."""
    if "metadata" not in entry:
        entry["metadata"] = None
    return entry
