"""Snapshots older than ``LADDER_SNAPSHOT_RETENTION_DAYS`` deleted (docs/architecture.md,
"Snapshots"); 0, the default, keeps every snapshot, as the event log keeps every event.

Every ``SWEEP_INTERVAL`` the history service lists the views that have snapshots (board, scope,
period: a walk of the index the reads scan, one entry a view) and deletes each view's snapshots
taken before the cut-off, ``DELETE_CHUNK`` snapshots a statement (with their users' rows, which
go by the foreign key, about 5,000 rows), each its own transaction, by a range of that index: no
statement reads a row it does not delete, nor holds MySQL's locks for long. A board deleted
without purge keeps its snapshots as history; this deletes those as well once they are that
old. Several history processes sweep alike: a delete that finds nothing costs one probe of the
index.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from datetime import UTC, datetime, timedelta

import structlog
from prometheus_client import Counter
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import snapshots, to_db_time
from shared.db_boards import SNAPSHOT_DELETE_CHUNK

log = structlog.get_logger(__name__)

SWEEP_INTERVAL = 3600.0
DELETE_CHUNK = SNAPSHOT_DELETE_CHUNK

EXPIRED = Counter(
    "ladder_history_snapshots_expired_total",
    "Snapshots deleted for being older than LADDER_SNAPSHOT_RETENTION_DAYS",
)


async def expire(engine: AsyncEngine, days: int, now: datetime | None = None) -> int:
    """Every snapshot taken more than ``days`` days before ``now`` deleted; how many were."""
    cutoff = to_db_time((now or datetime.now(UTC)) - timedelta(days=days))
    t = snapshots.c
    async with engine.connect() as conn:
        views = (await conn.execute(select(t.board_id, t.scope, t.period).distinct())).all()
    deleted = 0
    for board_id, scope, period in views:
        old = (t.board_id == board_id, t.scope == scope, t.period == period, t.taken_at < cutoff)
        while True:
            async with engine.begin() as conn:
                statement = delete(snapshots).where(*old)
                result = await conn.execute(
                    statement.with_dialect_options(mysql_limit=DELETE_CHUNK)
                )
            deleted += result.rowcount
            EXPIRED.inc(result.rowcount)
            if result.rowcount < DELETE_CHUNK:
                break
    if deleted:
        log.info("snapshots expired", snapshots=deleted, days=days)
    return deleted


async def until_stopped(
    engine: AsyncEngine, days: int, stop: asyncio.Event, interval: float = SWEEP_INTERVAL
) -> None:
    """A sweep every ``interval`` seconds until ``stop``, the first at a random moment of the
    first interval (processes started together sweep apart); none at all with ``days`` 0, which
    waits for ``stop`` alone. A sweep that fails is logged; the next one starts over."""
    if not days:
        await stop.wait()
        return
    wait = random.uniform(0, interval)
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        if stop.is_set():
            return
        try:
            await expire(engine, days)
        except Exception:
            log.exception("snapshot expiry failed; retrying next interval")
        wait = interval
