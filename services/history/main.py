"""The history service: the ``ladder.scores.history`` queue into the MySQL event log.

Run as ``python -m services.history``. Start-up opens MySQL (and refuses to go on unless the
schema is migrated), Redis, then the ops endpoints and the consumer; shutdown goes in reverse.
SIGTERM or SIGINT stops taking messages, lets the batch in hand be stored and acked, and gives
up after ``LADDER_SHUTDOWN_GRACE_SECONDS``: anything unacked then is simply delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog
import uvloop
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import HistoryHandler
from services.history.migrate import check_schema
from shared.consumer import ConsumerRunner
from shared.db import open_engine
from shared.logs import configure
from shared.ops import Check, serve_ops
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

            async def broker() -> bool:
                return runner.ready

            async def redis_up() -> bool:
                return bool(await redis.ping())

            checks: dict[str, Check] = {
                "broker": broker,
                "redis": redis_up,
                "mysql": _mysql_check(engine),
            }
            async with serve_ops(settings.ops_host, settings.history_port, checks, set(checks)):
                await _consume(runner, settings.shutdown_grace_seconds)
    log.info("history stopped")


async def _consume(runner: ConsumerRunner, grace_seconds: float) -> None:
    loop = asyncio.get_running_loop()
    stop_asked = asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        log.info("stopping", signal=signum.name, grace_seconds=grace_seconds)
        runner.stop()
        stop_asked.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    consuming = asyncio.create_task(runner.run())
    stopping = asyncio.create_task(stop_asked.wait())
    try:
        await asyncio.wait({consuming, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not consuming.done():
            try:
                await asyncio.wait_for(consuming, grace_seconds)
            except TimeoutError:
                log.error("shutdown deadline passed; the unacked batch will be redelivered")
                return
        consuming.result()  # a consumer that died on its own ends the service loudly
    finally:
        stopping.cancel()
        if not consuming.done():
            consuming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consuming
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def main() -> None:
    settings = LadderSettings()
    configure("history", settings.log_level)
    log.info("starting", port=settings.history_port, batch=settings.history_batch)
    try:
        uvloop.run(run(settings))
    except Exception:
        # One JSON line with the cause, for whoever reads the logs rather than the terminal.
        log.exception("history failed")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
