"""Several API processes on one port: ``LADDER_API_WORKERS`` above 1.

:func:`run_workers` binds the port once and starts that many worker processes on it, each a
whole API (its own relay and Pub/Sub hub): the relays are consumers of the same outbox group, so
each entry is published by one of them, and every hub hears every push, so a push reaches a
socket whichever worker holds it. The parent only passes
SIGTERM on and waits; if a worker dies, it stops the others and exits, for the process manager
to start the API again whole. ``/metrics`` sums the counters of every worker (Prometheus'
multiprocess mode); the WebSocket gauges carry a ``pid`` label, the relay's are one series.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
from types import FrameType

import structlog
import uvicorn

from services.api.serving.uvicorn_server import serve
from shared.logs import configure
from shared.settings import LadderSettings, load_settings, share_multiprocess_metrics_dir

log = structlog.get_logger(__name__)


def _worker(listener: socket.socket) -> None:
    # A spawned process: settings and logging are made again from the inherited environment.
    settings = load_settings("api")
    configure("api", settings.log_level)
    sys.exit(serve(settings, [listener]))


def listening(settings: LadderSettings) -> socket.socket:
    """The API's port, bound once for every worker; its "running on" line goes through the JSON
    logs (``log_config=None``), as every other line does."""
    app = "services.api.app:create_app"  # only to bind: each worker builds its own
    config = uvicorn.Config(app, host=settings.api_host, port=settings.api_port, log_config=None)
    return config.bind_socket()


def run_workers(settings: LadderSettings) -> int:
    """``LADDER_API_WORKERS`` API processes on one listening socket; the exit status."""
    listener = listening(settings)
    multiprocessing.allow_connection_pickling()
    spawn = multiprocessing.get_context("spawn")
    # Every worker's metrics, summed by whichever answers /metrics (shared/ops.py).
    metrics_dir = tempfile.mkdtemp(prefix="ladder-api-metrics-")
    share_multiprocess_metrics_dir(metrics_dir)
    workers = [
        spawn.Process(target=_worker, args=(listener,), name=f"api-{n}")
        for n in range(settings.api_workers)
    ]
    stopping = False

    def stop(signum: int, _: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.pid is not None and worker.exitcode is None:
                # A process group stop has signalled them already; a second SIGTERM is harmless.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for worker in workers:
        worker.start()
    log.info("api workers started", workers=[w.pid for w in workers])
    status = 0
    while running := [w for w in workers if w.exitcode is None]:
        multiprocessing.connection.wait([w.sentinel for w in running])
        for worker in workers:
            if worker.exitcode is not None and not stopping:
                log.error("api worker ended; stopping the others", pid=worker.pid)
                status = worker.exitcode or 1
                stop(signal.SIGTERM, None)
    listener.close()
    shutil.rmtree(metrics_dir, ignore_errors=True)
    return status
