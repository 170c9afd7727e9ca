"""The baselines every figure is given against, measured in the same run: R, a bare Redis write
loop, and U, a bare uvicorn endpoint under the same wrk load (POSTs as fast as it answers, GETs
at the reads' rate)."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from bench import load
from bench.load import WrkResult
from bench.phases import BENCH_PREFIX, Bench
from bench.report import Line, Row, ms


@dataclass(frozen=True)
class Baselines:
    redis_rate: float  # R, submissions a second
    port: int  # where the bare endpoint runs whenever it is started again
    bare: WrkResult  # U, POSTs as fast as it answers
    bare_read: WrkResult  # U, GETs at the reads' rate

    @property
    def bare_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# The group of processes (bench/cpu.py) the loop's threads run in: this process.
LOOP_GROUP = "the bench itself"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(bench: Bench) -> tuple[Baselines, list[Line]]:
    loop = await asyncio.to_thread(
        load.redis_loop, bench.ladder.settings.redis_url, BENCH_PREFIX, seconds=bench.seconds
    )
    port = free_port()
    with load.BareServer(port, bench.workers):
        bare_url = f"http://127.0.0.1:{port}"
        load.wrk(bare_url, "post.lua", seconds=3)
        bare = await asyncio.to_thread(load.wrk, bare_url, "post.lua", seconds=bench.seconds)
        # The reads' baseline: the same server answering a constant at the reads' rate.
        bare_read = await asyncio.to_thread(load.reads, bare_url, "/healthz", seconds=bench.seconds)
    rows: list[Line] = [
        Row(
            "R: bare Redis write loop (8 threads, FCALL + 2 EXPIRE NX)",
            f"{loop.rate:,.0f} /s",
            "1.00 R",
        ),
        # The yardstick of the machine's speed in this run: the CPU figures below are absolute.
        Row(
            "  … CPU a submission: Redis; the loop's client (redis-py)",
            f"{loop.cpu_per_submission('Redis'):,.0f} µs; "
            f"{loop.cpu_per_submission(LOOP_GROUP):,.0f} µs",
        ),
        Row(
            "U: bare uvicorn endpoint, POST (wrk, 64 connections)",
            f"{bare.rate:,.0f} req/s",
            "1.00 U",
        ),
        Row("U: bare uvicorn endpoint, GET at 500 req/s: p50", ms(bare_read.p50_ms)),
        Row("  … p99", ms(bare_read.p99_ms)),
    ]
    return Baselines(loop.rate, port, bare, bare_read), rows
