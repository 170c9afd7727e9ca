"""The history consumer's handlers: the event log, each event (its board's life, user and id)
exactly once, and the marks of the views each event changed, for the snapshots."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

import orjson
import structlog
from prometheus_client import Counter
from redis.asyncio import Redis
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.snapshotter import changed_views
from shared.consumer import Handler
from shared.db import board_deletions, board_epoch_of, from_db_time, score_events, to_db_time
from shared.erased_events import delete_stored
from shared.erasure import StoredTombstones, stored_tombstones, to_ms
from shared.events import ScoreAccepted, outbox_position, period_ids_text
from shared.keys import Keys

log = structlog.get_logger(__name__)

ROWS = Counter(
    "ladder_history_events_total",
    "Events offered to the event log, by whether they were new or already stored",
    ["outcome"],
)
for _outcome in ("inserted", "duplicate"):  # each series at 0 from the start
    ROWS.labels(_outcome)
LATE = Counter(
    "ladder_history_late_erased_total",
    "Events stored while their user's erasure was being recorded, deleted again after the store",
)

PURGED = Counter(
    "ladder_history_late_purged_total",
    "Events stored while their board's deletion with purge was being recorded, deleted again "
    "after the store",
)

# Rows a driver call. The driver also splits them into statements of at most 1 MB; this bounds
# a statement's size well under MariaDB's default 16 MiB max_allowed_packet whatever the driver
# does and whatever LADDER_HISTORY_BATCH says (a row is at most about 3 KiB: its metadata, at
# most 1 KiB of JSON, doubled at worst by escaping, and well under 1 KiB of the rest).
CHUNK_ROWS = 1000


# The columns one event fills, in the order of its parameters in INSERT_EVENTS.
COLUMNS = (
    "event_id",
    "board_id",
    "user_id",
    "region",
    "team_id",
    "display_name",
    "value",
    "occurred_at",
    "accepted_at",
    "subscore",
    "metadata",
    "board_epoch",
    "periods",
    "outbox_ms",
    "outbox_seq",
)

# One row's statement, run with the driver's executemany: asyncmy rewrites an INSERT ... VALUES
# with one row of placeholders into multi-row statements itself (each under its
# max_stmt_length, 1 MB), escaping every parameter as it would for a single execute. Compiling a
# SQLAlchemy insert of a thousand rows instead cost more CPU than everything else the consumer
# does with an event. MySQL reports 1 for an inserted row and 0 for a duplicate left as it was.
INSERT_EVENTS = (
    f"INSERT INTO `{score_events.name}` ({', '.join(f'`{c}`' for c in COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * len(COLUMNS))}) "
    "ON DUPLICATE KEY UPDATE id = id"
)


def _row(event: ScoreAccepted, epoch: int) -> tuple[Any, ...]:
    """The parameters of INSERT_EVENTS for ``event``, in the order of COLUMNS.

    The metadata is stored as ``orjson.dumps`` writes it: the compact text the API made of the
    object and handed to the write function, which the rebuild hands it again (``SubmitEvent``).
    The periods are those the write put the event in, which the rebuild replays it into; the
    outbox position is where the write put it in the board's order, which the rebuild replays
    it in (NULL for an event published without one, by a relay of the release before).
    """
    metadata = None if event.metadata is None else orjson.dumps(event.metadata).decode()
    position = (None, None) if event.outbox_id is None else outbox_position(event.outbox_id)
    return (
        event.event_id,
        event.board_id,
        event.user_id,
        event.region,
        event.team_id,
        event.display_name,
        event.value,
        to_db_time(event.occurred_at),
        to_db_time(event.accepted_at),
        event.subscore,
        metadata,
        epoch,
        # A board has a period at least: an event with none tells none (NULL, as before 0010).
        period_ids_text(event.periods) or None,
        *position,
    )


def _epoch(event: ScoreAccepted, cutoff: datetime | None) -> int:
    if cutoff is None or event.accepted_at > cutoff:
        return 0
    return board_epoch_of(cutoff)


class HistoryHandler:
    """The history consumer's handler: one multi-row upsert a batch, in one transaction.

    The unique key on (board_id, board_epoch, user_id, event_id) makes the write idempotent, so
    a batch the broker delivers again after a crash before the ack stores nothing twice; an
    event of a board deleted since lands on its epoch (one purged, deleted again after the
    commit: ``LateErasures``). ``ON DUPLICATE KEY UPDATE id = id`` rather than ``INSERT
    IGNORE``: IGNORE also swallows genuine errors (a value out of range would be stored
    clipped), and every warning it raises costs asyncmy a ``SHOW WARNINGS`` round trip. Give it
    an engine made with ``changed_rows=True`` for honest inserted / duplicate counts; with any
    other the events are stored just the same.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        if not events:
            return
        inserted = 0
        async with self.engine.begin() as conn:
            # An event of a board deleted since (accepted by its cut-off), kept as its history
            # is, lands on that board's epoch: a redelivery of it is a duplicate there, not an
            # event of a board made later under the name (shared/db.py ``board_epoch``).
            t = board_deletions.c
            found = await conn.execute(
                select(t.board_id, t.cutoff).where(t.board_id.in_({e.board_id for e in events}))
            )
            cutoffs = {row.board_id: from_db_time(row.cutoff) for row in found}
            rows = [_row(event, _epoch(event, cutoffs.get(event.board_id))) for event in events]
            for start in range(0, len(rows), CHUNK_ROWS):
                result = await conn.exec_driver_sql(INSERT_EVENTS, rows[start : start + CHUNK_ROWS])
                inserted += result.rowcount
        duplicates = len(rows) - inserted
        ROWS.labels("inserted").inc(inserted)
        ROWS.labels("duplicate").inc(duplicates)
        log.debug("events stored", inserted=inserted, duplicates=duplicates)


class LateErasures:
    """After a batch is stored: its events of a user whose erasure was recorded meanwhile
    (accepted at or before its cut-off), deleted from the event log again, and handed to
    ``on_erased`` (the consumer's :class:`~shared.uncount.Uncount`), as if the filter before the
    store had left them out.

    The filter (shared/erasure.py ``skipping``) reads the tombstones before the store, and the
    erasure deletes the user's rows in passes that start after its tombstone is recorded; a
    batch filtered before the tombstone and stored after the last pass would keep its events.
    This look comes after the batch's commit, in a transaction of its own: a tombstone recorded
    before it is seen here, and one recorded after it was recorded after the commit, so the
    erasure's passes, which follow it, find the rows. An event left in the log either way is
    none. One query a batch; the deletes only when a tombstone is found.

    The same look (:meth:`purges`, given the whole batch) deletes again the batch's events of a
    board whose deletion with purge was recorded meanwhile (accepted by its cut-off): the filter
    leaves a purged board's events out, and the store's own read of the deletions puts them on
    the deletion's epoch, but both may come before the deletion's row commits and the insert
    after the purge's last pass. Not storing what the store's read finds purged would not do:
    a deletion committed between that read and the insert is not seen there. The look after the
    commit sees every deletion committed before it, and the purge's passes, which start after
    its row commits, find every row committed before that.

    :meth:`dropped` is the filter's hand-over of the events it leaves out: the same deletes
    (of nothing, unless an earlier delivery of the batch was stored and its look failed), then
    ``on_erased``."""

    def __init__(self, engine: AsyncEngine, secret: str, on_erased: Handler) -> None:
        self._engine = engine
        self._secret = secret
        self._tombstones = StoredTombstones(engine, secret)
        self._on_erased = on_erased

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        async with self._engine.connect() as conn:
            cutoffs = await stored_tombstones(conn, {e.user_id for e in events}, self._secret)
        late = [
            e for e in events if e.user_id in cutoffs and to_ms(e.accepted_at) <= cutoffs[e.user_id]
        ]
        if not late:
            return
        await delete_stored(self._engine, late)
        LATE.inc(len(late))
        log.info("events of users erased meanwhile deleted after their store", events=len(late))
        # What the filter would have handed over: a deleted board's events are not taken back.
        _, erased = await self._tombstones.split(late)
        if erased:
            await self._on_erased(erased)

    async def dropped(self, events: list[ScoreAccepted]) -> None:
        await delete_stored(self._engine, events)
        await self._on_erased(events)

    async def purges(self, events: list[ScoreAccepted]) -> None:
        """The purge's look, given the whole batch after the filtered one is stored (not the
        kept events alone): a delivery whose look failed after its store is delivered again, and
        the filter then leaves the purged board's events out, while their rows stay."""
        async with self._engine.connect() as conn:
            t = board_deletions.c
            found = await conn.execute(
                select(t.board_id, t.cutoff).where(
                    t.board_id.in_({e.board_id for e in events}), t.purge.is_(True)
                )
            )
            purges = {row.board_id: from_db_time(row.cutoff) for row in found}
        if purges:
            await self._purged(events, purges)

    async def _purged(self, events: list[ScoreAccepted], purges: dict[str, datetime]) -> None:
        """The rows of those of ``events`` a purge recorded meanwhile covers (its board's,
        accepted by its cut-off: of epoch 0 or of its own, as the purge deletes them,
        services/api/erased_rows.py ``purge_board``), deleted in one transaction."""
        covered = [
            e for e in events if e.board_id in purges and e.accepted_at <= purges[e.board_id]
        ]
        ids: dict[tuple[str, str], list[str]] = defaultdict(list)
        for event in covered:
            ids[(event.board_id, event.user_id)].append(event.event_id)
        if not ids:
            return
        e, deleted = score_events.c, 0
        async with self._engine.begin() as conn:
            for (board_id, user_id), event_ids in sorted(ids.items()):
                cutoff = purges[board_id]
                result = await conn.execute(
                    delete(score_events).where(
                        e.board_id == board_id,
                        e.user_id == user_id,
                        e.event_id.in_(event_ids),
                        e.board_epoch.in_([0, board_epoch_of(cutoff)]),
                        e.accepted_at <= to_db_time(cutoff),
                    )
                )
                deleted += result.rowcount
        if deleted:
            PURGED.inc(deleted)
            log.info("events of boards purged meanwhile deleted after their store", events=deleted)


class MarkChangedViews:
    """Marks the views a batch changed in each board's ``Keys.snapshot_dirty`` set, for the
    snapshot ticker (:mod:`services.history.snapshotter`). A set: a view marked twice is one mark,
    and a redelivered batch marks nothing new."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        marks: dict[str, set[str]] = defaultdict(set)
        # A batch's events share a few views: the members are named once a distinct (board,
        # region, team or not, periods) rather than a dozen strings built for every event.
        seen: set[tuple[Any, ...]] = set()
        for event in events:
            views = (
                event.board_id,
                event.region,
                event.team_id is None,
                *[(period, result.period_id) for period, result in event.periods.items()],
            )
            if views not in seen:
                seen.add(views)
                marks[event.board_id].update(changed_views(event))
        if not marks:
            return
        # One single-key SADD a board: no multi-key command, so any shard layout will do.
        async with self._redis.pipeline(transaction=False) as pipe:
            for board_id, members in marks.items():
                pipe.sadd(self._keys.snapshot_dirty(board_id), *members)
            await pipe.execute()


def in_order(*handlers: Handler) -> Handler:
    """One handler that runs ``handlers`` one after the other on each batch; a failure stops
    the rest, and the runner hands the same events over again, the whole batch after an outage
    or fewer of them after a refusal (every handler here is idempotent)."""

    async def handle(events: list[ScoreAccepted]) -> None:
        for handler in handlers:
            await handler(events)

    return handle
