"""The history service: the ``ladder.scores.history`` queue into the MySQL event log.

Run as ``python -m services.history``. Start-up opens MySQL (and refuses to go on unless the
schema is migrated), Redis, then the ops endpoints and the consumer; shutdown goes in reverse.
SIGTERM or SIGINT stops taking messages, lets the batch in hand be stored and acked, and gives
up after ``LADDER_SHUTDOWN_GRACE_SECONDS``: anything unacked then is simply delivered again.
"""

from __future__ import annotations

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import HistoryHandler
from services.history.migrate import check_schema
from shared import service
from shared.consumer import ConsumerRunner
from shared.db import open_engine
from shared.ops import Check
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import Topology

log = structlog.get_logger(__name__)


def _mysql_check(engine: AsyncEngine) -> Check:
    async def check() -> bool:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    return check


async def run(settings: LadderSettings) -> None:
    """Consume until a signal asks to stop (or the consumer fails, which raises)."""
    async with open_engine(settings.mysql_url, changed_rows=True) as engine:
        await check_schema(engine)
        async with open_redis(settings.redis_url) as redis:
            runner = ConsumerRunner(
                name="history",
                amqp_url=settings.amqp_url,
                topology=Topology(settings.broker_prefix, settings.delivery_limit),
                handler=HistoryHandler(engine),
                prefetch=settings.consumer_prefetch,
                batch_size=settings.history_batch,
                flush_ms=settings.history_flush_ms,
            )
            await service.consume(
                runner,
                host=settings.ops_host,
                port=settings.history_port,
                checks={**service.checks_of(runner, redis), "mysql": _mysql_check(engine)},
                grace_seconds=settings.shutdown_grace_seconds,
            )
    log.info("history stopped")


def main() -> None:
    service.run("history", run)


if __name__ == "__main__":
    main()
