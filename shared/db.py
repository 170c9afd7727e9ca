"""The history database: its tables, the engine factory and the event reads.

Tables: ``score_events`` (the event log), ``boards`` (board definitions), ``friendships`` (one
row per direction of a mutual friendship), ``friend_requests`` (requests pending an answer),
``snapshots`` (top-N views over time) and ``snapshot_users`` (who each holds). Reads and writes
of boards and snapshots are in :mod:`shared.db_boards`, of friendships and requests in
:mod:`shared.friendships`.

MySQL (or MariaDB) is Ladder's source of truth. Times are stored as naive UTC ``DATETIME(6)``
(a ``TIMESTAMP`` would follow the session time zone and end in 2038) and come back out as aware
UTC. The schema itself is made by the alembic migrations of ``services/history``; the table
here must match them and is what ``alembic revision --autogenerate`` compares against.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from pydantic import Field
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.mysql import DATETIME, MEDIUMTEXT
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from typing_extensions import TypedDict

from shared.events import rfc3339

# Identifiers are case-sensitive by the API's patterns ("Ab" and "ab" are two event ids), so
# they compare in binary: the server's default *_ci collation would make the unique key below
# swallow a distinct event as a duplicate.
ID_COLLATION = "utf8mb4_bin"
EVENTS_PAGE_MAX = 1000

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
    }
)


def _table(name: str, *parts: Any) -> Table:
    """A table of the history database: InnoDB (transactions, and the consistent snapshot the
    rebuild reads in), utf8mb4 (any display name)."""
    return Table(name, metadata, *parts, mysql_engine="InnoDB", mysql_charset="utf8mb4")


def _ident(length: int) -> String:
    """An identifier column's type, compared in binary (see ``ID_COLLATION``)."""
    return String(length, collation=ID_COLLATION)


score_events = _table(
    "score_events",
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", _ident(64), nullable=False),
    Column("board_id", _ident(32), nullable=False),
    Column("user_id", _ident(64), nullable=False),
    Column("region", _ident(32), nullable=False),
    Column("team_id", _ident(32), nullable=True),
    Column("display_name", String(64), nullable=True),
    Column("value", BigInteger, nullable=False),
    Column("occurred_at", DATETIME(fsp=6), nullable=False),
    Column("accepted_at", DATETIME(fsp=6), nullable=False),
    # On boards with a subscore_order (NULL elsewhere, and for events stored before 0003).
    Column("subscore", BigInteger, nullable=True),
    # The metadata object as ``orjson.dumps``'s compact JSON text, the very text of the live
    # write for a rebuild (NULL: none); at most 1 KiB. TEXT, not JSON: see ``boards``.
    Column("metadata", Text, nullable=True),
    # 0 for the board as it is; for an event a deleted board kept (a deletion without purge),
    # the deletion's cut-off in ms (shared/erasure.py finish_board_deletion): a board made later
    # under the name is another board, whose event ids may be the same. (Migration 0008.)
    Column("board_epoch", BigInteger, nullable=False, server_default=text("0")),
    # The periods the write put the event in, as ``daily=2026-11-29,alltime=all``
    # (shared/events.py period_ids_text), which the rebuild replays it into. NULL for an event
    # stored before migration 0010: replayed into the periods of the board's definition.
    Column("periods", String(120), nullable=True),
    # The event's entry id in its board's outbox stream (shared/events.py ``outbox_id``), as two
    # numbers (ids do not sort as text): the order the writes were applied in, which the rebuild
    # replays (services/rebuild/event_log.py). NULL for events stored before migration 0012.
    Column("outbox_ms", BigInteger, nullable=True),
    Column("outbox_seq", BigInteger, nullable=True),
    # The idempotency key of the event log: a redelivered event lands on it and changes nothing.
    # An event id belongs to its board and user (docs/api.md section 4): another user's event of
    # the same id is another event, and so is an event of a deleted board's successor.
    # (Migrations 0004 and 0008; before them, (board_id, event_id).)
    UniqueConstraint("board_id", "board_epoch", "user_id", "event_id"),
    # A user's events newest first, and the keyset cursor, are one range scan of this index.
    Index(None, "board_id", "user_id", "accepted_at", "id"),
    # A board's events in the rebuild's order, one range scan a page: those without a position
    # first (NULL sorts first), in id order, then by position.
    Index(None, "board_id", "outbox_ms", "outbox_seq", "id"),
)

# A board definition as JSON text (MEDIUMTEXT: MariaDB's JSON is a LONGTEXT alias that alembic
# would report as a change on every comparison). The source of truth the API restores the Redis
# hash ``Keys.boards`` from.
boards = _table(
    "boards",
    Column("board_id", _ident(32), primary_key=True),
    Column("definition", MEDIUMTEXT, nullable=False),
    Column("created_at", DATETIME(fsp=6), nullable=False),
    Column("updated_at", DATETIME(fsp=6), nullable=False),
)

# Both directions of a friendship are rows, so one user's friends are one primary-key range.
friendships = _table(
    "friendships",
    Column("user_id", _ident(64), primary_key=True),
    Column("friend_id", _ident(64), primary_key=True),
    Column("created_at", DATETIME(fsp=6), nullable=False),
)

# A player's friend request that the other side has not answered: ``user_id`` asked
# ``friend_id``. A user's own requests are one primary-key range; the requests pending to a user,
# oldest first (the order in which they are dropped past the cap), one range of the index.
friend_requests = _table(
    "friend_requests",
    Column("user_id", _ident(64), primary_key=True),
    Column("friend_id", _ident(64), primary_key=True),
    Column("created_at", DATETIME(fsp=6), nullable=False),
    Index(None, "friend_id", "created_at"),
)

# Users hidden on a board (a shadow ban, docs/api.md section 8b): the truth that the Redis set
# ``Keys.hidden`` is filled from again by the rebuild. A board's hidden users are one range.
hidden_users = _table(
    "hidden_users",
    Column("board_id", _ident(32), primary_key=True),
    Column("user_id", _ident(64), primary_key=True),
    Column("hidden_at", DATETIME(fsp=6), nullable=False),
)

# An erased user's tombstone (docs/api.md section 8b): keyed by an HMAC of the user id
# (shared.erasure.user_hash), so that it names nobody once done. ``user_id`` is held only while
# the erasure is pending (the worker needs it), and NULL once done. Events of the user accepted
# at or before ``cutoff`` are the erased user's: every consumer and the rebuild skip them.
erasures = _table(
    "erasures",
    Column("user_hash", _ident(64), primary_key=True),
    Column("user_id", _ident(64), nullable=True),
    Column("cutoff", DATETIME(fsp=6), nullable=False),
    Column("done_at", DATETIME(fsp=6), nullable=True),
    Index(None, "done_at"),
)

# A deleted board's cut-off: its events accepted at or before ``cutoff``, and its snapshots
# taken by then, belong to the deleted board, not to a fresh board of the same name; with
# ``purge`` they are deleted from this database too.
board_deletions = _table(
    "board_deletions",
    Column("board_id", _ident(32), primary_key=True),
    Column("cutoff", DATETIME(fsp=6), nullable=False),
    Column("purge", Boolean, nullable=False),
    Column("done_at", DATETIME(fsp=6), nullable=True),
    # The cut-off of the board's deletion before this one (NULL for its first): the snapshots
    # taken up to it are an earlier board's, which a purge of this one leaves. (Migration 0011.)
    Column("previous_cutoff", DATETIME(fsp=6), nullable=True),
    Index(None, "done_at"),
)

snapshots = _table(
    "snapshots",
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("board_id", _ident(32), nullable=False),
    Column("scope", _ident(80), nullable=False),
    Column("period", _ident(8), nullable=False),
    Column("period_id", _ident(16), nullable=False),
    Column("taken_at", DATETIME(fsp=6), nullable=False),
    Column("entries", MEDIUMTEXT, nullable=False),
    # "The newest of a view taken at or before a time" is one backward range scan of this index.
    Index(None, "board_id", "scope", "period", "taken_at"),
    # A view's snapshot of one take, stored once: a pass that lost its snapshot lease mid-way
    # and its successor store the same set under the same taken_at, the time it was taken
    # (services/history/snapshotter.py). (Migration 0009.)
    UniqueConstraint("board_id", "scope", "period", "period_id", "taken_at"),
)

# Who each snapshot holds, a row a user, so that an erasure finds the user's snapshots by key,
# not by reading every snapshot stored; a snapshot's rows go with it. (Migration 0013.)
_SNAPSHOT = ForeignKey("snapshots.id", ondelete="CASCADE")
snapshot_users = _table(
    "snapshot_users",
    Column("user_id", _ident(64), primary_key=True),
    Column("snapshot_id", BigInteger, _SNAPSHOT, primary_key=True),
    Index(None, "snapshot_id"),
)


def after_deletion(column: Any, board_id: str) -> Any:
    """The condition that a time ``column`` (``accepted_at``, ``taken_at``) of a board's row
    lies after the board's last deletion, if it was ever deleted: the rows before belong to the
    deleted board, not to a fresh board of the same name (docs/api.md section 8b)."""
    cutoff = (
        select(board_deletions.c.cutoff)
        .where(board_deletions.c.board_id == board_id)
        .scalar_subquery()
    )
    return or_(cutoff.is_(None), column > cutoff)


class BadCursor(ValueError):
    """A pagination cursor that this module did not make (the API answers 422)."""


class EventRecord(TypedDict):
    """One stored event as the API shows it (docs/api.md section 7); the feed's entries have
    the same shape. ``subscore`` and ``metadata`` are always there, null when the event had
    none, so that a client reads every event the same way."""

    event_id: str
    user_id: str
    region: str
    team_id: str | None
    value: int
    subscore: Annotated[
        int | None, Field(description="The event's subscore; null on boards without one")
    ]
    metadata: Annotated[
        dict[str, Any] | None, Field(description="The event's metadata object; null if none")
    ]
    occurred_at: str
    accepted_at: str


def engine(
    url: str, *, changed_rows: bool = False, pool_size: int = 5, pool_recycle: int = 1800
) -> AsyncEngine:
    """An async engine of ``url`` (``mysql+asyncmy://...``); nothing connects until first use.

    ``pool_pre_ping`` and ``pool_recycle`` (below the server's ``wait_timeout``) keep a pool that
    outlives a database restart or an idle night from handing out dead connections.

    ``changed_rows`` makes ``rowcount`` count the rows a statement changed, MySQL's own default,
    instead of the rows it matched, which SQLAlchemy forces for the ORM. Only with it does
    ``INSERT ... ON DUPLICATE KEY UPDATE id = id`` report 0 for a duplicate, which is how the
    history writer tells new events from redeliveries. Ladder uses Core only, so nothing else
    depends on the matched-rows count.
    """
    connect_args: dict[str, Any] = {}
    if changed_rows:
        # Replaces SQLAlchemy's CLIENT.FOUND_ROWS; the driver adds the flags it needs itself.
        connect_args["client_flag"] = 0
    return create_async_engine(
        url,
        pool_pre_ping=True,
        pool_recycle=pool_recycle,
        pool_size=pool_size,
        connect_args=connect_args,
    )


@contextlib.asynccontextmanager
async def open_engine(url: str, *, changed_rows: bool = False) -> AsyncIterator[AsyncEngine]:
    """:func:`engine` for the length of a block, its pool disposed of on the way out."""
    db = engine(url, changed_rows=changed_rows)
    try:
        yield db
    finally:
        await db.dispose()


def to_db_time(moment: datetime) -> datetime:
    """An aware time as the naive UTC that ``DATETIME`` columns hold."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def from_db_time(stored: datetime) -> datetime:
    return stored.replace(tzinfo=UTC)


def board_epoch_of(cutoff: datetime) -> int:
    """The ``board_epoch`` of the events a board deleted at ``cutoff`` keeps: the cut-off in
    whole ms since 1970, as migration 0008 counts it, in integers (the same in every process)."""
    return (to_db_time(cutoff) - datetime(1970, 1, 1)) // timedelta(milliseconds=1)


def _cursor_tag(board_id: str, user_id: str) -> str:
    """What a cursor carries of the read that handed it out: a digest of its board and user."""
    return hashlib.blake2b(f"{board_id}\n{user_id}".encode(), digest_size=6).hexdigest()


def _encode_cursor(tag: str, accepted_at: datetime, row_id: int) -> str:
    raw = orjson.dumps([accepted_at.isoformat(timespec="microseconds"), row_id, tag])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode_cursor(tag: str, cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stored_at, row_id, made_for = orjson.loads(raw)
        # A naive ISO time is what _encode_cursor writes; anything else was not made here.
        accepted_at = datetime.fromisoformat(stored_at)
    except (binascii.Error, orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise BadCursor("cursor is not one that this API returned") from exc
    if accepted_at.tzinfo is not None or type(row_id) is not int or row_id < 1:
        raise BadCursor("cursor is not one that this API returned")
    if made_for != tag:
        raise BadCursor("cursor was handed out for another board or user")
    return accepted_at, row_id


async def user_events(
    engine: AsyncEngine, board_id: str, user_id: str, limit: int, cursor: str | None
) -> tuple[list[EventRecord], str | None]:
    """A page of the user's stored events on a board, newest first, and the next page's cursor.

    Order is ``accepted_at`` then ``id``, both descending; the cursor is the last row's pair, so
    a page never repeats or skips an event however many arrive while a client pages through.
    Raises :class:`BadCursor` for a cursor that this function did not return.
    """
    if not 1 <= limit <= EVENTS_PAGE_MAX:
        raise ValueError(f"limit must be within 1..{EVENTS_PAGE_MAX}")
    t = score_events.c
    query = (
        select(
            t.id,
            t.event_id,
            t.user_id,
            t.region,
            t.team_id,
            t.value,
            t.subscore,
            t.metadata,
            t.occurred_at,
            t.accepted_at,
        )
        .where(
            t.board_id == board_id, t.user_id == user_id, after_deletion(t.accepted_at, board_id)
        )
        .order_by(t.accepted_at.desc(), t.id.desc())
        .limit(limit + 1)  # one more than asked says whether a next page exists
    )
    if cursor is not None:
        after_at, after_id = _decode_cursor(_cursor_tag(board_id, user_id), cursor)
        # Spelled out rather than as a row comparison, which MariaDB does not turn into a range.
        query = query.where(
            or_(t.accepted_at < after_at, and_(t.accepted_at == after_at, t.id < after_id))
        )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    page = rows[:limit]
    events: list[EventRecord] = [
        {
            "event_id": row.event_id,
            "user_id": row.user_id,
            "region": row.region,
            "team_id": row.team_id,
            "value": row.value,
            "subscore": row.subscore,
            "metadata": None if row.metadata is None else orjson.loads(row.metadata),
            "occurred_at": rfc3339(from_db_time(row.occurred_at)),
            "accepted_at": rfc3339(from_db_time(row.accepted_at)),
        }
        for row in page
    ]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = _encode_cursor(_cursor_tag(board_id, user_id), last.accepted_at, last.id)
    return events, next_cursor


async def count_events(
    engine: AsyncEngine, board_id: str, event_id: str | None = None, user_id: str | None = None
) -> int:
    """How many events a board holds (or holds under one ``event_id``: one a user, so 0 or 1
    with a ``user_id``)."""
    query = (
        select(func.count()).select_from(score_events).where(score_events.c.board_id == board_id)
    )
    if event_id is not None:
        query = query.where(score_events.c.event_id == event_id)
    if user_id is not None:
        query = query.where(score_events.c.user_id == user_id)
    async with engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())
