"""A running simulation: the SimPy model in real time, its scores posted, its parameters live.

The model runs on a :class:`simpy.rt.RealtimeEnvironment` in a thread of its own (SimPy's
real-time environment sleeps between events); one SimPy process, the ticker, hands the scores
due every ``tick_s`` wall-clock seconds to the asyncio side, which posts them as one batch.
``speed`` is the environment's factor (1/speed wall seconds per simulated second). Changes from
the control exchange replace the model's parameters in one reference swap, read by the next
arrival, round or tick. SIGTERM and SIGINT stop the ticker, send what is waiting, the late
scores held back included (for up to ``DRAIN_SECONDS``), and close the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import simpy
import simpy.rt
import structlog

from sim.control import Listener
from sim.model import Game
from sim.params import SimParams
from sim.poster import Poster

log = structlog.get_logger("sim")

DRAIN_SECONDS = 10.0
SUMMARY_SECONDS = 10.0
# Late scores stay this far inside the lateness the API allows, for clock skew and queueing.
LATENESS_MARGIN_S = 60.0


class ScaledRealtime(simpy.rt.RealtimeEnvironment):
    """A real-time environment whose speed can change while it runs."""

    def retime(self, factor: float) -> None:
        """From now on, one simulated second takes ``factor`` wall seconds. The base of the
        time mapping moves to now, so that the past is not re-timed."""
        self.env_start = self.now
        self._factor = factor
        self.sync()


@dataclass(frozen=True, slots=True)
class Config:
    api_url: str
    board_id: str
    server_key: str
    admin_key: str
    amqp_url: str
    broker_prefix: str
    seed: int
    allowed_lateness: float
    duration: float | None = None  # wall seconds; None runs until a signal
    dry_run: bool = False
    keep_records: bool = False  # the model keeps every player and score (tests)
    already_playing: int = 0  # players in the game from the first moment


class Simulation:
    def __init__(self, config: Config, params: SimParams) -> None:
        self.config = config
        self.env = ScaledRealtime(factor=1.0 / params.speed, strict=False)
        self.game = Game(
            self.env,
            params,
            seed=config.seed,
            run_id=uuid.uuid4().hex[:10],
            clock=lambda: datetime.now(UTC),
            late_cap_wall_s=max(0.0, config.allowed_lateness - LATENESS_MARGIN_S),
            keep=config.keep_records,
        )
        self.stopping = threading.Event()
        self.stop_requested = asyncio.Event()
        self.listener = Listener(config.amqp_url, config.broker_prefix, self.apply)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poster: Poster | None = None

    # -- live control ----------------------------------------------------------------------------
    def apply(self, name: str, value: Any) -> None:
        """Apply one change; raises ``ValueError`` (and changes nothing) if it is not valid."""
        new = self.game.params.changed(name, value)
        old = getattr(self.game.params, name)
        self.game.params = new
        log.info("parameter changed", name=name, old=old, new=getattr(new, name))

    # -- the SimPy side (its own thread) ---------------------------------------------------------
    def _ticker(self) -> Generator[simpy.Event, Any, None]:
        speed = self.game.params.speed
        while not self.stopping.is_set():
            params = self.game.params
            if params.speed != speed:
                speed = params.speed
                self.env.retime(1.0 / speed)
            yield self.env.timeout(params.tick_s * speed)
            due = [score.body() for score in self.game.take_due()]
            if due and self._loop is not None and self._poster is not None:
                self._loop.call_soon_threadsafe(self._poster.add, due)

    def _run_model(self) -> None:
        ticker = self.env.process(self._ticker())
        self.game.start(self.config.already_playing)
        self.env.sync()
        self.env.run(until=ticker)

    # -- the asyncio side ------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.stop_requested.set()

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self.request_stop)
        async with httpx.AsyncClient(base_url=self.config.api_url, timeout=10.0) as client:
            poster = Poster(
                client,
                self.config.board_id,
                self.config.server_key,
                self.config.admin_key,
                dry_run=self.config.dry_run,
            )
            self._poster = poster
            ensure = asyncio.create_task(poster.ensure_board())
            stop = asyncio.create_task(self.stop_requested.wait())
            await asyncio.wait({ensure, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not ensure.done():
                ensure.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ensure
                return
            stop.cancel()
            ensure.result()
            log.info(
                "simulation starting",
                board_id=self.config.board_id,
                seed=self.config.seed,
                api=self.config.api_url,
                params=self.game.params.model_dump(),
            )
            listening = asyncio.create_task(self.listener.run())
            posting = asyncio.create_task(poster.run(), name="posting")
            reporting = asyncio.create_task(self._report(poster), name="reporting")
            model = asyncio.create_task(asyncio.to_thread(self._run_model), name="model")
            try:
                await self._until_stopped(model, posting, reporting)
            finally:
                log.info("simulation stopping")
                self.stopping.set()
                with contextlib.suppress(Exception):
                    await model
                # The model's thread is done: what it still holds (late scores held back) goes
                # out with the rest.
                poster.add([score.body() for score in self.game.take_held()])
                if not posting.done():
                    await poster.drain(DRAIN_SECONDS)
                self.listener.stop()
                for task in (posting, reporting):
                    task.cancel()
                await asyncio.gather(posting, reporting, return_exceptions=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(listening, 5.0)
                log.info("simulation stopped", **self.game.summary(), **poster.summary())

    async def _until_stopped(
        self, model: asyncio.Task[None], *background: asyncio.Task[None]
    ) -> None:
        """Until a signal, the duration, or the model ending. The posting or the reporting ending
        on its own (neither ever should) ends the run with its error, and the process exits for
        its supervisor to start it again: a demo whose scores stopped would otherwise look
        healthy."""
        waiting = asyncio.create_task(self.stop_requested.wait())
        done, _ = await asyncio.wait(
            {model, waiting, *background},
            timeout=self.config.duration,
            return_when=asyncio.FIRST_COMPLETED,
        )
        waiting.cancel()
        for task in background:
            if task in done:
                log.error("the simulation stops: a task of it ended", task=task.get_name())
                task.result()
                raise RuntimeError(f"{task.get_name()} ended while the simulation ran")
        if model in done:
            model.result()  # the model failing ends the run with its error

    async def _report(self, poster: Poster) -> None:
        while True:
            await asyncio.sleep(SUMMARY_SECONDS)
            log.info("simulation running", **self.game.summary(), **poster.summary())
