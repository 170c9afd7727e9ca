"""Running a consumer service: signals, the ops endpoints, the consumer and its companions."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import structlog
import uvloop

from shared.consumer import ConsumerRunner
from shared.ops import Check, serve_ops

log = structlog.get_logger(__name__)

Companion = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


def run(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)`` on uvloop; SIGTERM and SIGINT set ``stop``."""

    async def entry() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    uvloop.run(entry())


async def consume(
    runner: ConsumerRunner,
    stop: asyncio.Event,
    *,
    host: str,
    port: int,
    checks: Mapping[str, Check],
    grace_seconds: float,
    companions: tuple[Companion, ...] = (),
) -> None:
    """Serve ops, consume, and run ``companions`` until ``stop``; then drain within the grace.

    A companion is a loop of the service's own (a ticker) that returns once its event is set.
    """
    required = set(checks)
    async with serve_ops(host, port, checks, required):
        companion_stop = asyncio.Event()
        tasks = [asyncio.create_task(runner.run(), name="consumer")]
        tasks += [asyncio.create_task(c(companion_stop)) for c in companions]
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({stopper, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopper}:
            # A loop that ended by itself is a crash: let the process manager restart us.
            task.result()
            raise RuntimeError(f"{task.get_name()} ended unexpectedly")
        log.info("stopping: finishing the batch in hand", grace_seconds=grace_seconds)
        runner.stop()
        companion_stop.set()
        _, pending = await asyncio.wait(tasks, timeout=grace_seconds)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        stopper.cancel()
