"""Batch ingest: 500 events a request on 4 connections, accepted and through the consumers."""

from __future__ import annotations

from bench.phases import Bench, ingest
from bench.phases.baselines import Baselines
from bench.phases.ingest import Workload
from bench.report import Line, Row

BOARD = "bench-batch"
# CPU an event, all of Ladder's processes and engines until drained, in µs: the target.
CPU_TARGET = 250


async def measure(bench: Bench, base: Baselines) -> list[Line]:
    env = {"BENCH_BOARD": BOARD, "BENCH_KEY": bench.ladder.server_key, "BENCH_BATCH": "500"}
    run = await ingest.ingest(
        bench.ladder,
        Workload(BOARD, "batch.lua", connections=4, per_request=500, env=env),
        bench.seconds,
    )
    accepted = Row(
        "batch ingest (500 a request, 4 connections), accepted",
        f"{run.accepted:,.0f} ev/s",
        f"{run.accepted / base.redis_rate:.2f} R",
    )
    return ingest.rows(
        run,
        accepted,
        "batch ingest",
        base.redis_rate,
        unit="ev/s",
        target="≥ 5 R",
        times=5,
        cpu_target=CPU_TARGET,
    )
