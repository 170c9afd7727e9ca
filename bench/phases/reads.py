"""Reads on a board of a million members: the board is filled straight into its region's sorted
set, its memory measured, then each read goes through the API at a fixed rate, given as a ratio
to the bare endpoint's GETs at the same rate."""

from __future__ import annotations

import asyncio

from bench import load, probes
from bench.phases import Bench
from bench.phases.baselines import Baselines
from bench.report import Line, Note, Row, ms

BOARD = "bench-reads"
# The p99 of the rank and around-me reads, in U: the target.
READ_P99_TARGET = 2.0


async def measure(bench: Bench, base: Baselines) -> list[Line]:
    ladder, redis, members = bench.ladder, bench.redis, bench.options.members
    board_key = ladder.keys.region_view(BOARD, "alltime", "all", "eu")
    memory_before = await probes.used_memory(redis)
    fill_seconds = await probes.fill_board(redis, board_key, members)
    await redis.sadd(ladder.keys.regions(BOARD, "alltime", "all"), "eu")
    memory_after = await probes.used_memory(redis)
    ties_key = ladder.keys.ties(board_key)
    usage = await probes.memory_of(redis, board_key) + await probes.memory_of(redis, ties_key)
    rows: list[Line] = [
        Row(
            f"fill {members:,} members (pipelined ZADD and HSET of records)",
            f"{fill_seconds:.1f} s",
        ),
        Row(
            "Redis bytes per member, one board with its records (MEMORY USAGE)",
            f"{usage / members:.0f} B",
        ),
        Row(
            "Redis bytes per member, one board (INFO used_memory delta)",
            f"{(memory_after - memory_before) / members:.0f} B",
        ),
    ]
    for name, paths in probes.read_paths(BOARD, members).items():
        rows += await read(bench, base, name, paths)
    await redis.unlink(board_key, ties_key)
    return rows


async def read(bench: Bench, base: Baselines, name: str, paths: list[str]) -> list[Line]:
    """One kind of read: a short warm-up, then its latency at 500 requests a second."""
    api, joined = bench.ladder.api, " ".join(paths)
    await asyncio.to_thread(
        load.wrk, api, "get.lua", seconds=2, connections=4, rate=200, env={"BENCH_PATHS": joined}
    )
    result = await asyncio.to_thread(load.reads, api, joined, seconds=bench.seconds)
    rows: list[Line] = []
    if result.non2xx:
        rows.append(Note(f"{name}: {result.non2xx} answers were not 2xx"))
    # Ratios to the bare endpoint's answers at the same rate (U's GET rows); the target is one
    # of them (the rank and around-me p99s within twice the bare endpoint's).
    p99_ratio = result.p99_ms / base.bare_read.p99_ms
    target = f"≤ {READ_P99_TARGET:g} U" if name != "top-100" else ""
    rows += [
        Row(
            f"{name} read at 500 req/s: p50",
            ms(result.p50_ms),
            f"{result.p50_ms / base.bare_read.p50_ms:.1f} U",
        ),
        Row(
            "  … p99",
            ms(result.p99_ms),
            f"{p99_ratio:.1f} U",
            target,
            None if not target else p99_ratio <= READ_P99_TARGET,
        ),
    ]
    return rows
