"""The aggregator: regional boards merged into the global one on a ticker, and the live views of
play (hot streaks, team MVPs) recomputed on the same ticker.

Run as ``python -m services.aggregator``. Start-up opens Redis (loading the function library),
then the ops endpoints, the consumer and the ticker; shutdown goes in reverse (see
:func:`shared.service.consume`).
"""

from __future__ import annotations

import asyncio

import structlog

from services.aggregator.handlers import Each, MarkDirty
from services.aggregator.live_tracker import LiveViews, RecordLive
from services.aggregator.merge import Merger
from shared import service
from shared.boards import Board, BoardCatalog
from shared.keys import Keys
from shared.redis import open_redis
from shared.settings import LadderSettings

log = structlog.get_logger(__name__)


async def tick(
    merger: Merger, live: LiveViews, catalog: BoardCatalog, interval: float, stop: asyncio.Event
) -> None:
    """Merge every board and recompute its live views every ``interval`` seconds until
    ``stop``; one last pass on the way."""

    async def work(board: Board) -> None:
        await merger.merge_board(board)
        await live.tick_board(board)

    await service.every_board(catalog, interval, stop, work)


async def run(settings: LadderSettings) -> None:
    """Consume and tick until a signal asks to stop (or either fails, which raises)."""
    keys = Keys(settings.key_prefix)
    async with open_redis(settings.redis_url, load_functions=True) as redis:
        catalog = BoardCatalog(redis, keys)
        await catalog.ensure_defaults()
        merger = Merger(redis, keys)
        live = LiveViews(redis, keys)
        handler = Each(MarkDirty(redis, keys), RecordLive(redis, keys, catalog))
        runner = service.consumer("aggregator", settings, handler)

        async def ticker(stop: asyncio.Event) -> None:
            await tick(merger, live, catalog, settings.merge_interval, stop)

        await service.consume(
            runner, redis, settings, port=settings.aggregator_port, companions=(ticker,)
        )


def main() -> None:
    service.run("aggregator", run)
