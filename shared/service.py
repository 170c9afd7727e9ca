"""Running a consumer service: signals, the ops endpoints, the consumer and its companions.

The ops endpoints listen first, before the service opens anything it needs: a service that
starts while Redis, MySQL or the broker is down answers ``/healthz`` at once (a liveness probe
must not restart it while it waits) and ``/readyz`` with 503, naming what it is waiting for
and why (:class:`Opening`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any

import structlog
import uvloop
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from typing_extensions import TypedDict, Unpack

from shared.boards import Board, BoardCatalog
from shared.consumer import ConsumerRunner, Handler
from shared.failures import short_reason
from shared.library import check_library
from shared.logs import configure
from shared.ops import Check, Reasons, serve_ops
from shared.redis import open_redis
from shared.settings import LadderSettings, SettingsError, load_settings
from shared.topology import Consumer, Topology

log = structlog.get_logger(__name__)

Companion = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


def run(service: str, main: Callable[[LadderSettings], Coroutine[Any, Any, None]]) -> None:
    """The entry point of a service: settings, JSON logs, ``main(settings)`` on uvloop.

    A failure is logged as one JSON line and ends the process with status 1, so that the process
    manager restarts it; settings it cannot work with, found at start (a Redis database the
    server has not), end it with status 2 and a line naming the setting, as
    :func:`load_settings` does.
    """
    settings = load_settings(service)
    configure(service, settings.log_level)
    try:
        uvloop.run(main(settings))
    except SettingsError as exc:
        log.error(f"invalid settings: {exc}")
        raise SystemExit(2) from None
    except Exception:
        log.exception(f"{service} failed")
        raise SystemExit(1) from None


class Batching(TypedDict, total=False):
    """How a consumer batches deliveries, where it differs from :class:`ConsumerRunner`'s
    defaults."""

    batch_size: int
    flush_ms: int
    idle_gap: float | None


def consumer(
    name: Consumer, settings: LadderSettings, handler: Handler, **batching: Unpack[Batching]
) -> ConsumerRunner:
    """The runner of ``name``'s queue, with the broker settings every consumer shares."""
    return ConsumerRunner(
        name=name,
        amqp_url=settings.amqp_url,
        topology=Topology(settings.broker_prefix, settings.delivery_limit),
        handler=handler,
        prefetch=settings.consumer_prefetch,
        **batching,
    )


def checks_of(
    runner: ConsumerRunner, redis: Redis, library: bool = False, cluster: bool = False
) -> dict[str, Check]:
    """The dependencies every consumer needs: the broker and Redis (with ``library``, Redis
    holding the function library, which its handler calls)."""

    async def broker() -> bool:
        return runner.ready

    async def redis_up() -> bool:
        if not await redis.ping():
            return False
        if library:
            await check_library(redis, cluster)
        return True

    return {"broker": broker, "redis": redis_up}


async def _not_open() -> bool:
    return False


class Opening:
    """What a consumer's ``/readyz`` checks from the moment its ops endpoints listen: each
    dependency is down until the service has opened it, saying why (``reasons``: not connected
    yet, connecting, or the error its last try failed on), and then its own check takes over."""

    def __init__(self, dependencies: Iterable[str]) -> None:
        # Read by the ops endpoints at each request (shared/ops.py), so changed in place.
        self.checks: dict[str, Check] = {name: _not_open for name in dependencies}
        self._waiting = {name: "not connected yet" for name in self.checks}
        self._more: Reasons | None = None
        # Whether the service's Redis must hold the function library (:meth:`redis`).
        self.library = False

    def connecting(self, name: str) -> Callable[[BaseException], None]:
        """``name`` is being opened: what its opening calls with each error it waits on."""
        self._waiting[name] = "connecting"

        def failed(error: BaseException) -> None:
            self._waiting[name] = short_reason(error)

        return failed

    def redis(
        self, settings: LadderSettings, *, load_functions: bool = True
    ) -> contextlib.AbstractAsyncContextManager[Redis]:
        """The service's Redis for a block, waited for at start with ``redis``'s reasons here
        (the function library loaded first unless the service calls none)."""
        self.library = load_functions
        return open_redis(
            settings.redis_url,
            cluster=settings.redis_cluster,
            load_functions=load_functions,
            wait=True,
            waiting=self.connecting("redis"),
        )

    def opened(self, name: str, check: Check, reasons: Reasons | None = None) -> None:
        """``name`` is open: ``check`` says whether it is up from now on, and ``reasons`` (if
        given) why it or something of the service's own is not."""
        self._waiting.pop(name, None)
        self.checks[name] = check
        if reasons is not None:
            self._more = reasons

    def reasons(self) -> dict[str, str]:
        return {**self._waiting, **(self._more() if self._more is not None else {})}


@contextlib.asynccontextmanager
async def serving_ops(
    settings: LadderSettings, port: int, dependencies: Iterable[str]
) -> AsyncIterator[Opening]:
    """The ops endpoints on ``port`` for the block, ready once every one of ``dependencies``
    is opened (:meth:`Opening.opened`) and up."""
    opening = Opening(dependencies)
    checks = opening.checks
    async with serve_ops(settings.ops_host, port, checks, set(checks), opening.reasons):
        yield opening


async def consume(
    runner: ConsumerRunner,
    redis: Redis,
    settings: LadderSettings,
    opening: Opening,
    *,
    companions: tuple[Companion, ...] = (),
) -> None:
    """Consume and run ``companions`` until SIGTERM or SIGINT; then stop taking deliveries and
    give the batch in hand (and the companions) the shutdown grace to finish. Anything unacked
    after that is simply delivered again. Readiness (``opening``, whose endpoints listen
    already) checks the broker and Redis from now on, besides what the service opened itself.

    A companion is a loop of the service's own (a ticker) that returns once its event is set.
    A consumer or companion that ends by itself is a crash and raises.
    """
    checks = checks_of(runner, redis, opening.library, settings.redis_cluster)
    for name, check in checks.items():
        opening.opened(name, check, runner.reasons)
    grace_seconds = settings.shutdown_grace_seconds
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        companion_stop = asyncio.Event()
        tasks = [asyncio.create_task(runner.run(), name="consumer")]
        tasks += [asyncio.create_task(c(companion_stop), name="companion") for c in companions]
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({stopper, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for task in done - {stopper}:
            task.result()
            raise RuntimeError(f"{task.get_name()} ended by itself")
        log.info("stopping: finishing the batch in hand", grace_seconds=grace_seconds)
        runner.stop()
        companion_stop.set()
        finished, pending = await asyncio.wait(tasks, timeout=grace_seconds)
        for task in finished:
            if not task.cancelled() and (error := task.exception()) is not None:
                log.error("failed while stopping", task=task.get_name(), exc_info=error)
        if pending:
            log.error("shutdown deadline passed; the unacked batch will be redelivered")
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def every_board(
    catalog: BoardCatalog,
    interval: float,
    stop: asyncio.Event,
    work: Callable[[Board], Awaitable[object]],
) -> None:
    """Run ``work`` on every board every ``interval`` seconds until ``stop`` (as
    :func:`every_pass`)."""

    async def each(boards: list[Board]) -> None:
        for board in boards:
            with board_step(board, "board pass"):
                await work(board)

    await every_pass(catalog, interval, stop, each)


@contextlib.contextmanager
def board_step(board: Board, what: str) -> Iterator[None]:
    """One board's step of a pass over the boards: a failure of its own is logged and the pass
    goes on to the next board, so that a board that keeps failing holds back none sorted after
    it. Redis out of reach fails the whole pass (one log line, not one a board)."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError):
        raise
    except Exception:
        log.exception(f"{what} failed; retrying next pass", board_id=board.board_id)


async def every_pass(
    catalog: BoardCatalog,
    interval: float,
    stop: asyncio.Event,
    work: Callable[[list[Board]], Awaitable[object]],
) -> None:
    """Run ``work`` on all the boards every ``interval`` seconds until ``stop``, with one last
    pass on the way out. A pass that fails (Redis or MySQL away) is logged and retried next
    tick: the work it had to do waits in Redis."""
    while True:
        stopping = stop.is_set()
        try:
            await work(await catalog.all())
        except Exception:
            log.exception("periodic pass failed; retrying next tick")
        if stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
