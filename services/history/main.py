"""The history service: the ``ladder.scores.history`` queue into the MySQL event log, and the
top-N snapshots of the views that changed, every ``LADDER_SNAPSHOT_INTERVAL``.

Run as ``python -m services.history``. Start-up serves the ops endpoints (not ready until what
follows is open), opens MySQL (waiting for it while it does not answer, and refusing to go on
unless the schema is migrated), Redis, then the consumer and the snapshot ticker; shutdown goes
in reverse.
SIGTERM or SIGINT stops taking messages, lets the batch in hand be stored and acked, and gives
up after ``LADDER_SHUTDOWN_GRACE_SECONDS``: anything unacked then is simply delivered again.
"""

from __future__ import annotations

import asyncio

import structlog
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history import snapshot_retention
from services.history.handlers import HistoryHandler, LateErasures, MarkChangedViews, in_order
from services.history.migrate import wait_for_schema
from services.history.snapshotter import Snapshotter, tick
from shared import service
from shared.boards import BoardCatalog
from shared.consumer import Handler
from shared.db import open_engine
from shared.erasure import StoredTombstones, skipping
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.ops import Check
from shared.settings import LadderSettings
from shared.uncount import Uncount

log = structlog.get_logger(__name__)


def _mysql_check(engine: AsyncEngine) -> Check:
    async def check() -> bool:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    return check


def batch_handler(
    engine: AsyncEngine, redis: Redis, keys: Keys, settings: LadderSettings
) -> Handler:
    """The consumer's handler of a batch: the event log, then the marks of the views it
    changed. Erased users' and purged boards' events in flight are not stored (read from MySQL);
    a board's deleted without purge are, its history staying, but mark nothing: its keys went
    within seconds of the deletion, and a late event must not bring one back (nor mark the
    views of a board made since under its name). The events of a user whose erasure, or
    of a board whose deletion with purge, was recorded while the batch went in are deleted
    again after its commit (``LateErasures``)."""
    secret = settings.effective_jwt_secret
    deleted = StoredTombstones(engine, secret, purged_only=False)
    marks = skipping("history_marks", deleted, MarkChangedViews(redis, keys))
    uncount = Uncount(redis, keys)
    # The event log first: the views are marked only for events that are stored. Then the
    # events of a user whose erasure was recorded while the batch went in, out again.
    late = LateErasures(engine, secret, uncount)
    handler = in_order(HistoryHandler(engine), late, marks)
    filtered = skipping("history", StoredTombstones(engine, secret), handler, late.dropped)

    async def handle(events: list[ScoreAccepted]) -> None:
        await filtered(events)
        await late.purges(events)  # the whole batch: see LateErasures.purges

    return handle


async def run(settings: LadderSettings) -> None:
    """Consume until a signal asks to stop (or the consumer fails, which raises)."""
    dependencies = ("broker", "redis", "mysql")
    async with (
        service.serving_ops(settings, settings.history_port, dependencies) as opening,
        open_engine(settings.mysql_url, changed_rows=True) as engine,
    ):
        await wait_for_schema(engine, waiting=opening.connecting("mysql"))
        opening.opened("mysql", _mysql_check(engine))
        async with opening.redis(settings, load_functions=False) as redis:
            keys = Keys(settings.key_prefix)
            catalog = BoardCatalog(redis, keys)
            snapshotter = Snapshotter(redis, keys, engine, settings.snapshot_size)
            runner = service.consumer(
                "history",
                settings,
                batch_handler(engine, redis, keys, settings),
                batch_size=settings.history_batch,
                flush_ms=settings.history_flush_ms,
                # Off the push path: a batch takes its whole window and fills.
                idle_gap=None,
            )

            async def ticker(stop: asyncio.Event) -> None:
                await tick(snapshotter, catalog, settings.snapshot_interval, stop)

            # Snapshots past LADDER_SNAPSHOT_RETENTION_DAYS, deleted (snapshot_retention.py).
            async def expiring(stop: asyncio.Event) -> None:
                await snapshot_retention.until_stopped(
                    engine, settings.snapshot_retention_days, stop
                )

            companions = (ticker, expiring)
            await service.consume(runner, redis, settings, opening, companions=companions)
    log.info("history stopped")


def main() -> None:
    service.run("history", run)
