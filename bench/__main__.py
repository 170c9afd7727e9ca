"""``python -m bench``: every figure of BENCHMARKS.md in one run; ``--check`` only says (by
its status) whether Ladder answers, for ``make bench`` to decide whether to ``make up``.

Environment: ``BENCH_SECONDS`` (each load phase, default 15), ``BENCH_OUT`` (default
``BENCHMARKS.md``), ``BENCH_WS_SAMPLES`` (default 200), ``BENCH_MEMBERS`` (default 1,000,000),
and the ``LADDER_*`` settings of the Ladder under test (ports, URLs, keys).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import httpx

from bench import probes
from bench.machine import machine, versions
from bench.phases import (
    BENCH_PREFIX,
    Bench,
    baselines,
    batch,
    cluster,
    commands,
    idle,
    instructions,
    merge,
    push,
    reads,
    single,
    sizes,
    staleness,
)
from bench.report import Report, write_report
from bench.settings import BenchSettings
from shared.logs import configure
from shared.redis import library_source, open_redis
from shared.settings import LadderSettings, load_settings


def ready(settings: LadderSettings) -> bool:
    try:
        response = httpx.get(f"http://127.0.0.1:{settings.api_port}/readyz", timeout=2)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


async def define_boards(ladder: probes.Ladder) -> None:
    for board in (single.BOARD, batch.BOARD):
        await ladder.define(board)  # board main's definition: 4 periods, incr
    await ladder.define("bench-ws", notify_top=[1, 10, 100])
    await ladder.define(reads.BOARD, periods=["alltime"])
    await asyncio.sleep(0.5)


async def measure(bench: Bench, report: Report) -> None:
    """Every phase, in order, each one's rows into the report as it ends."""
    print("baselines", flush=True)
    base, rows = await baselines.measure(bench)
    report.take(rows)
    print("single-event POSTs", flush=True)
    report.take(await single.measure(bench, base))
    print("batch ingest", flush=True)
    report.take(await batch.measure(bench, base))
    report.take(await sizes.write_path(bench, batch.BOARD))
    report.take(await commands.measure())
    print("Redis instructions per write (callgrind)", flush=True)
    report.take(await instructions.measure())
    print("POST → WebSocket push", flush=True)
    report.take(await push.measure(bench))
    print(f"reads on a board of {bench.options.members:,} members", flush=True)
    report.take(await reads.measure(bench, base))
    print("aggregator merge", flush=True)
    report.take(await merge.measure(bench))
    print("global view staleness after a start with a backlog (private stack)", flush=True)
    report.take(await staleness.measure())
    print("MySQL", flush=True)
    report.take(await sizes.mysql(bench))
    print("one Redis primary against a cluster of three, and WAIT (private servers)", flush=True)
    report.take(await cluster.measure(bench.seconds))
    print(f"idle, then with {idle.IDLE_BOARDS:,} more boards", flush=True)
    report.take(await idle.measure(bench))


# The machine is quiet enough for the figures when the load average (1 min) is under this:
# a run waits for it, after `make up` has just started the services, at most SETTLE_MOST s.
QUIET_LOAD = 1.0
SETTLE_MOST = 180.0


async def settle() -> float:
    """Wait until the 1-minute load average is under :data:`QUIET_LOAD`, or :data:`SETTLE_MOST`
    seconds have passed (the report then says the machine was busy); the load average then."""
    deadline = time.monotonic() + SETTLE_MOST
    load = os.getloadavg()[0]
    if load >= QUIET_LOAD:
        print(f"load average {load:.2f}: waiting for it to fall under {QUIET_LOAD}", flush=True)
    while load >= QUIET_LOAD and time.monotonic() < deadline:
        await asyncio.sleep(5)
        load = os.getloadavg()[0]
    return load


async def main(options: BenchSettings) -> int:
    settings = load_settings("bench")
    configure("bench", "WARNING")
    workers = settings.api_workers
    load_before = await settle()
    report = Report()
    began = time.monotonic()
    async with (
        open_redis(settings.redis_url, cluster=settings.redis_cluster) as redis,
        httpx.AsyncClient(timeout=30) as http,
    ):
        ladder = probes.Ladder(
            settings,
            redis,
            http,
            sorted(settings.effective_server_keys)[0],
            sorted(settings.effective_admin_keys)[0],
        )
        # Another checkout's services may have loaded an older library; the API's is this one.
        await redis.function_load(library_source(), replace=True)
        await ladder.clean(BENCH_PREFIX)
        try:
            print(f"Ladder benchmarks: {machine()}; API workers: {workers}", flush=True)
            the_versions = await versions(settings, ladder)
            await define_boards(ladder)
            await measure(Bench(ladder, options), report)
        finally:
            await ladder.clean(BENCH_PREFIX)
    elapsed = time.monotonic() - began
    print(f"done in {elapsed / 60:.1f} min", flush=True)
    loads = (load_before, os.getloadavg()[0])
    write_report(options.out, report, the_versions, workers, options.seconds, elapsed, loads)
    print(f"wrote {options.out}")
    return 0


def cli() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Ladder's benchmarks against the running Ladder: prints their table and "
        "writes BENCHMARKS.md. Settings: BENCH_SECONDS, BENCH_OUT, BENCH_WS_SAMPLES, "
        "BENCH_MEMBERS and the LADDER_* settings of the Ladder under test.",
        epilog="The phases on private servers of their own also run alone, printing their "
        "rows and writing nothing: python -m bench.phases.staleness (the global view's "
        "staleness after a start with a backlog), python -m bench.phases.cluster, python -m "
        "bench.phases.commands, python -m bench.phases.instructions.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="measure nothing; exit 0 if Ladder answers /readyz, 1 if not",
    )
    if parser.parse_args().check:
        return 0 if ready(load_settings()) else 1
    return asyncio.run(main(BenchSettings()))


if __name__ == "__main__":
    sys.exit(cli())
