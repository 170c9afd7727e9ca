"""The aggregator: the views derived from events (feed, stats, users' regions and teams) kept
from each consumed batch (services/aggregator/derive.py), regional boards merged into the global
one, and the live views of play (hot streaks, team MVPs) recomputed, each on its own ticker of
``LADDER_MERGE_INTERVAL``: a merge backlog (thousands of dirty users after a restart) drains in
bounded passes, one after another, while the live views and their pushes keep their cadence.

Run as ``python -m services.aggregator``. Start-up serves the ops endpoints (not ready until
what follows is open), opens Redis (loading the function library), then the consumer and the
tickers; shutdown goes in reverse (see :func:`shared.service.consume`).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from redis.asyncio import Redis

from services.aggregator import closer as closes
from services.aggregator.closer import Closer
from services.aggregator.derive import Derive
from services.aggregator.fresh import FreshRegions
from services.aggregator.handlers import Each, MarkDirty, aggregate
from services.aggregator.late_erasures import LateErasures
from services.aggregator.live_tracker import LiveViews, RecordLive
from services.aggregator.merge import Merger
from services.aggregator.period_relay import PeriodRelay
from services.aggregator.trim import Trimmer, until_stopped
from shared import service
from shared.boards import BoardCatalog
from shared.consumer import Handler
from shared.erasure import Tombstones, skipping
from shared.keys import Keys
from shared.lease import Lease, give_up
from shared.settings import LadderSettings

log = structlog.get_logger(__name__)


# Seconds a board's merge pass may take before the next board's (and the next pass) get a turn.
MERGE_BUDGET = 0.25


async def merges(
    merger: Merger,
    catalog: BoardCatalog,
    interval: float,
    stop: asyncio.Event,
    fresh: FreshRegions | None = None,
) -> None:
    """Merge every board, a bounded pass each, until ``stop``: again at once while a board is
    behind, else after ``interval``; one last pass on the way. Before each pass, the pushes that
    earlier passes could not make (rank messages and top-10 pushes whose publish failed:
    services/aggregator/pass_pushes.py), then the top-10 pushes of the regional views that
    events changed (``fresh``), which do not wait for the merge; after it, a bounded step of the
    dense builds that reads asked for, of the boards that have either to do (one round trip for
    all: :meth:`Merger.with_work`). A pass that fails is logged and retried: its work waits in
    Redis."""
    while True:
        stopping = stop.is_set()
        try:
            boards = await catalog.all()
            merging, building = await merger.with_work([b.board_id for b in boards])
            if fresh is not None:
                fresh.keep_only({b.board_id for b in boards})
            for board in boards:
                with service.board_step(board, "merge"):
                    await merger.push_fresh(board, fresh)
                    if board.board_id in merging:
                        await merger.merge_board(board, MERGE_BUDGET)
                    if board.board_id in building:
                        await merger.build_dense(board, MERGE_BUDGET)
        except Exception:
            log.exception("merge pass failed; retrying next tick")
        if stopping:
            return
        if merger.behind:
            await asyncio.sleep(0)  # a backlog: the next pass now, after what is waiting
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


async def tick(
    merger: Merger,
    live: LiveViews,
    catalog: BoardCatalog,
    interval: float,
    stop: asyncio.Event,
    fresh: FreshRegions | None = None,
) -> None:
    """The merge and the live views, apart, each every ``interval`` seconds until ``stop``; then
    the merge and live leases this aggregator holds are given up (shared/lease.py), so that
    another aggregator, or this one restarted, takes the boards over at once: a board's merge
    that a backlog left partway goes on from its merging set, and its live views are not held
    back for the lease's three intervals."""
    try:
        await asyncio.gather(
            merges(merger, catalog, interval, stop, fresh),
            service.every_pass(catalog, interval, stop, live.tick),
        )
    finally:
        await give_up(merger.lease, live.lease)


def batch_handler(
    redis: Redis, keys: Keys, catalog: BoardCatalog, settings: LadderSettings, fresh: FreshRegions
) -> Handler:
    """The consumer's handler of a batch: the derived views, the dirty marks, the live views.
    Erased users' and deleted boards' events in flight change no view; the pairs an erased user's
    writes changed are synced into the regional distinct sets all the same
    (:meth:`Derive.sync_dropped`), so that those stay exact (the erasure takes the user's entries
    out). A deleted board's are not: its views went with its keys, and a board made since under
    its name is another (shared/erasure.py ``skipping``). The events of a user whose erasure was
    recorded while the batch went in are taken out again after the apply (``LateErasures``), and
    on a delivery again after that look failed, once the filter left them out
    (``LateErasures.dropped``)."""
    secret = settings.effective_jwt_secret
    derive = Derive(redis, keys, catalog, settings.feed_length)
    apply = aggregate(derive, MarkDirty(redis, keys, fresh), RecordLive(redis, keys, catalog))
    # After the whole apply, the tombstones read again.
    late = LateErasures(redis, keys, catalog, secret, settings.future_tolerance_seconds)
    handler = Each(apply, late)
    tombstones = Tombstones(redis, keys, secret)
    # The events it leaves out: their pairs synced, then what an earlier delivery applied and
    # its failed look left (LateErasures.dropped).
    dropped = Each(derive.sync_dropped, late.dropped)
    return skipping("aggregator", tombstones, handler, on_dropped=dropped)


async def run(settings: LadderSettings) -> None:
    """Consume and tick until a signal asks to stop (or either fails, which raises)."""
    keys = Keys(settings.key_prefix)
    dependencies = ("broker", "redis")
    async with (
        service.serving_ops(settings, settings.aggregator_port, dependencies) as opening,
        opening.redis(settings) as redis,
    ):
        catalog = BoardCatalog(redis, keys)
        await catalog.ensure_defaults()
        # A board's merge lease lasts three merge intervals: the boards of an aggregator that
        # died are merged by another within that (lease.py).
        lease = Lease(redis, keys, ttl=3 * settings.merge_interval)
        merger, fresh = Merger(redis, keys, lease), FreshRegions()
        # So are its live views, by a lease of their own: one aggregator computes them.
        live = LiveViews(redis, keys, Lease(redis, keys, ttl=lease.ttl, kind="live"))
        consume = batch_handler(redis, keys, catalog, settings, fresh)
        # Off the push path (its views are pushed by its tickers): a batch takes its whole
        # window and fills.
        runner = service.consumer("aggregator", settings, consume, idle_gap=None)

        async def ticker(stop: asyncio.Event) -> None:
            await tick(merger, live, catalog, settings.merge_interval, stop, fresh)

        # Period ends (docs/api.md section 8b): closed here, relayed to ladder.periods.
        closer = Closer(
            redis,
            keys,
            lateness=settings.allowed_lateness,
            merge_interval=settings.merge_interval,
            size=settings.snapshot_size,
            outbox_max=settings.periods_outbox_max,
        )
        relay = PeriodRelay(redis, keys, catalog, settings)

        async def closing(stop: asyncio.Event) -> None:
            await closes.tick(closer, catalog, stop)

        # The users' hashes of boards without alltime, trimmed (services/aggregator/trim.py),
        # each board's by the aggregator that holds its trim lease, for two intervals.
        future, lateness = settings.future_tolerance_seconds, settings.allowed_lateness
        trim_lease = Lease(redis, keys, ttl=2 * settings.trim_interval, kind="trim")
        trimmer = Trimmer(redis, keys, lateness=lateness, future=future, lease=trim_lease)

        async def trimming(stop: asyncio.Event) -> None:
            await until_stopped(trimmer, catalog, settings.trim_interval, stop)

        companions = (ticker, closing, relay.relay_until, trimming)
        await service.consume(runner, redis, settings, opening, companions=companions)


def main() -> None:
    service.run("aggregator", run)
