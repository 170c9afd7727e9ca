"""Single-event POSTs: as fast as Ladder takes them (and through its consumers), then their
latency at half that rate, next to the bare endpoint's under the same fixed rate."""

from __future__ import annotations

import asyncio
import uuid

from bench import load
from bench.phases import Bench, ingest
from bench.phases.baselines import Baselines
from bench.phases.ingest import Workload
from bench.report import Line, Row, ms

BOARD = "bench-single"
# The single-POST p99 at half saturation, in U: the target.
HALF_SATURATION_P99_TARGET = 3.0
# CPU an event, all of Ladder's processes and engines until drained, in µs: the target.
CPU_TARGET = 800


async def measure(bench: Bench, base: Baselines) -> list[Line]:
    ladder = bench.ladder
    env = {"BENCH_BOARD": BOARD, "BENCH_KEY": ladder.server_key}
    run = await ingest.ingest(
        ladder, Workload(BOARD, "post.lua", connections=64, per_request=1, env=env), bench.seconds
    )
    accepted = Row(
        "single POST, accepted (64 connections)",
        f"{run.accepted:,.0f} /s",
        f"{run.accepted / base.redis_rate:.2f} R, {run.accepted / base.bare.rate:.2f} U",
    )
    rows = ingest.rows(
        run,
        accepted,
        "single POST",
        base.redis_rate,
        unit="/s",
        target="≥ 1.0 R",
        times=1,
        cpu_target=CPU_TARGET,
    )
    half = max(10.0, run.result.rate / 2)
    fixed = await asyncio.to_thread(
        load.wrk,
        ladder.api,
        "post.lua",
        seconds=bench.seconds,
        connections=16,
        rate=half,
        env=env | {"BENCH_RUN": "f" + uuid.uuid4().hex[:6]},
    )
    # The latency's baseline: the bare endpoint under the same fixed rate.
    with load.BareServer(base.port, bench.workers):
        bare_fixed = await asyncio.to_thread(
            load.wrk, base.bare_url, "post.lua", seconds=bench.seconds, connections=16, rate=half
        )
    rows += [
        Row(
            f"U: bare uvicorn endpoint, POST at {bare_fixed.rate:,.0f} req/s: p50",
            ms(bare_fixed.p50_ms),
        ),
        Row("  … p99", ms(bare_fixed.p99_ms)),
        Row(
            f"single POST latency at {fixed.rate:,.0f} req/s (half saturation): p50",
            ms(fixed.p50_ms),
            f"{fixed.p50_ms / bare_fixed.p50_ms:.1f} U",
        ),
        Row(
            "  … p99",
            ms(fixed.p99_ms),
            f"{fixed.p99_ms / bare_fixed.p99_ms:.1f} U",
            f"≤ {HALF_SATURATION_P99_TARGET:g} U",
            fixed.p99_ms / bare_fixed.p99_ms <= HALF_SATURATION_P99_TARGET,
        ),
    ]
    return rows
