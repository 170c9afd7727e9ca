"""``python -m bench``: every figure of BENCHMARKS.md in one run; ``--check`` only says (by
its status) whether Ladder answers, for ``make bench`` to decide whether to ``make up``.

Environment: ``BENCH_SECONDS`` (each load phase, default 15), ``BENCH_OUT`` (default
``BENCHMARKS.md``), ``BENCH_WS_SAMPLES`` (default 200), ``BENCH_MEMBERS`` (default 1,000,000),
and the ``LADDER_*`` settings of the Ladder under test (ports, URLs, keys).
"""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import aio_pika
import httpx
from sqlalchemy import text

from bench import cpu, load, probes
from bench.load import WrkResult
from shared.db import open_engine
from shared.logs import configure
from shared.redis import library_source, open_redis
from shared.settings import LadderSettings, load_settings

ROOT = Path(__file__).resolve().parent.parent
BENCH_PREFIX = "ladder-bench"


# What bounds the figures that miss their targets. The evidence of each run is in its own table
# (the CPU an event of every process, read from /proc over each ingest phase); the profiles
# behind the rest are in docs/architecture.md ("Performance").
BOUNDS = """\
## What bounds the missed targets

The rows "CPU an event, by process" above are this run's evidence: every process's CPU time
(from `/proc`) from the start of a load phase until the consumers drained, divided by the
events. Two cores give at most 2,000,000 µs a second, so an event that costs the pipeline
C µs in all cannot go through faster than 2,000,000 / C a second, whoever spends it.

- **Batch ingest is bound by Redis**, one core: the write function is most of its share.
  `ladder_submit_v2` on a board like `main` (four periods, teams) runs 65 Redis commands, the
  rate limits 6 more (it ran 97 before the expiry of a key was set once, when the write makes
  it, and before the distinct-score sets lost their per-score counts), against the 4 of the
  baseline's FCALL; its cost in Redis grows with the count of commands (each `redis.call` from
  Lua costs about as much again as the command itself). What would move it: the team boards
  kept by the aggregator, from the per-member contributions it already records for the MVP
  view, rather than by the write (about 18 of the 65 commands); boards with fewer periods;
  past one Redis, boards spread over cluster shards (their keys share one hash tag per board
  already).
- **Single POSTs are bound by the API's Python per request**, the largest share of their CPU,
  several times the bare endpoint's (2 cores / U). A py-spy profile of a worker under this load
  (docs/architecture.md): over a third of its main thread in uvicorn, Starlette and FastAPI
  (routing, middleware, sending the response), a quarter in the write's Redis call (packing its
  80 arguments with hiredis, the round trip, the answer), a tenth building the write's keys and
  arguments, the rest the handler, the metrics and the relay. What would move it: fewer, larger
  requests (the batch endpoint), or more cores.
- **Latency at half saturation.** The machine is still saturated by the rest of the pipeline
  (consumers, broker, Redis) while the API answers half the rate it can accept: p99 is
  scheduling delay on two shared cores, far above p50. The bare endpoint under the same rate
  (U's POST rows) is the floor; the ratios to it are Ladder's own cost, which shrinks with the
  API's per-request CPU above.
- **Reads on the million-member board.** The Redis side is O(log n) (`ZREVRANK`, `ZREVRANGE`)
  and a standing read is one Redis Function call. The bare endpoint answering a constant at the
  same rate (U's GET rows) sets the floor: its own p99 has been above 2 ms in every run on this
  machine (3.7 to 13 ms), scheduling on two shared cores. The reads' ratios to it are Ladder's
  own cost: about 1,200 µs of API CPU a read, over a third of it FastAPI solving the route's
  nine parameters and dependencies. What would move it: the read routes taking their query as
  the score POST takes its body, validated in one step.
- **The push** (met) waits for the relay, the broker's quorum-queue commit, the notifier's
  batch and Redis Pub/Sub; consumers hand a batch over once deliveries pause 3 ms.
"""


@dataclass
class Row:
    figure: str
    value: str
    ratio: str = ""
    target: str = ""
    met: bool | None = None


@dataclass
class Run:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(
        self, figure: str, value: str, ratio: str = "", target: str = "", met: bool | None = None
    ) -> None:
        row = Row(figure, value, ratio, target, met)
        self.rows.append(row)
        mark = "" if met is None else ("  [met]" if met else "  [MISSED]")
        print(f"  {figure:<58} {value:>26} {ratio:>10} {target}{mark}", flush=True)

    def note(self, text_: str) -> None:
        self.notes.append(text_)
        print(f"  note: {text_}", flush=True)


def ready(settings: LadderSettings) -> bool:
    try:
        response = httpx.get(f"http://127.0.0.1:{settings.api_port}/readyz", timeout=2)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ingest(
    ladder: probes.Ladder,
    run: Run,
    *,
    board: str,
    script: str,
    seconds: float,
    connections: int,
    per_request: int,
    env: dict[str, str],
) -> tuple[WrkResult, float, float | None, float, str]:
    """Load a board with wrk and follow the events through the consumers: (the wrk result,
    events accepted a second, events a second all the way through every consumer, events a
    broker message, the CPU per event of each process group until drained)."""
    url = ladder.api
    # Warm-up: connections, caches, the consumers' first batches; then let it drain through
    # every consumer, so that the measured run starts from an idle Ladder. The bench boards are
    # emptied at the start, so a board's event counter and its rows in MySQL count the same
    # events; requests wrk left in flight are answered after it returns, hence the re-check.
    before = await ladder.settled(board)
    consumed_before = await ladder.consumed()
    load.wrk(
        url,
        script,
        seconds=3,
        connections=connections,
        env=env | {"BENCH_RUN": "w" + uuid.uuid4().hex[:6]},
    )
    count0 = -1
    while count0 != await ladder.accepted(board):
        count0 = await ladder.settled(board)
        await ladder.drained(
            board, count0, consumed_before, count0 - before, time.monotonic() + 120
        )
    consumed0 = await ladder.consumed()
    relayed0 = await ladder.relayed()
    cpu0 = cpu.snapshot()
    started = time.monotonic()
    result = await asyncio.to_thread(
        load.wrk,
        url,
        script,
        seconds=seconds,
        connections=connections,
        env=env | {"BENCH_RUN": "m" + uuid.uuid4().hex[:6]},
    )
    total = await ladder.settled(board)
    accepted = total - count0
    sent = result.requests * per_request
    if accepted < sent * 0.99:
        run.note(
            f"{board}: {sent - accepted} of {sent} events were refused (HTTP non-2xx "
            f"{result.non2xx}); rate limits? make bench starts Ladder with LADDER_KEY_RATE high"
        )
    drained_at = await ladder.drained(board, total, consumed0, accepted, time.monotonic() + 300)
    through = None if drained_at is None else accepted / (drained_at - started)
    spent = cpu.per_event(cpu.spent(cpu0, cpu.snapshot()), max(1, accepted))
    events, messages = (b - a for a, b in zip(relayed0, await ladder.relayed(), strict=True))
    return result, accepted / result.seconds, through, events / max(1.0, messages), spent


async def versions(settings: LadderSettings, ladder: probes.Ladder) -> dict[str, str]:
    info = await ladder.redis.info("server")
    out = {
        "Python": platform.python_version(),
        "Redis": str(info["redis_version"]),
        "uvicorn": metadata.version("uvicorn"),
        "FastAPI": metadata.version("fastapi"),
        "redis-py": metadata.version("redis"),
        "aio-pika": metadata.version("aio-pika"),
        "wrk": load.wrk_version().split()[1].removeprefix("debian/"),
    }
    async with open_engine(settings.mysql_url) as engine, engine.connect() as conn:
        out["MariaDB"] = str((await conn.execute(text("SELECT VERSION()"))).scalar_one())
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        props = connection.transport.connection.server_properties if connection.transport else {}
        out["RabbitMQ"] = str(props.get("version", "?"))
    finally:
        await connection.close()
    return out


def machine() -> str:
    cores = os.cpu_count()
    with open("/proc/meminfo") as meminfo:
        total_kb = int(meminfo.readline().split()[1])
    return f"{cores} cores, {total_kb / 1024 / 1024:.1f} GiB RAM, {platform.platform()}"


def ms(value: float) -> str:
    if value == float("inf"):
        return "no push"
    return f"{value:.2f} ms" if value < 10 else f"{value:.0f} ms"


async def main() -> int:
    settings = load_settings()
    configure("bench", "WARNING")
    seconds = float(os.environ.get("BENCH_SECONDS", "15"))
    members = int(os.environ.get("BENCH_MEMBERS", "1000000"))
    ws_samples = int(os.environ.get("BENCH_WS_SAMPLES", "200"))
    out = Path(os.environ.get("BENCH_OUT", ROOT / "BENCHMARKS.md"))
    workers = settings.api_workers
    load_before = os.getloadavg()[0]
    run = Run()
    began = time.monotonic()
    async with (
        open_redis(settings.redis_url) as redis,
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
            for board in ("bench-single", "bench-batch"):
                await ladder.define(board)  # board main's definition: 4 periods, incr
            await ladder.define("bench-ws", notify_top=[1, 10, 100])
            await ladder.define("bench-reads", periods=["alltime"])
            await asyncio.sleep(0.5)

            print("baselines", flush=True)
            redis_rate = await asyncio.to_thread(
                load.redis_loop, settings.redis_url, BENCH_PREFIX, seconds=seconds
            )
            run.add(
                "R: bare Redis write loop (8 threads, FCALL + 2 EXPIRE NX)",
                f"{redis_rate:,.0f} /s",
                "1.00 R",
            )
            port = free_port()
            with load.BareServer(port, workers):
                bare_url = f"http://127.0.0.1:{port}"
                load.wrk(bare_url, "post.lua", seconds=3)
                bare = await asyncio.to_thread(load.wrk, bare_url, "post.lua", seconds=seconds)
                # The reads' baseline: the same server answering a constant at the reads' rate.
                bare_read = await asyncio.to_thread(
                    load.wrk,
                    bare_url,
                    "get.lua",
                    seconds=max(5.0, seconds / 2),
                    connections=4,
                    rate=500,
                    env={"BENCH_PATHS": "/healthz"},
                )
            run.add(
                "U: bare uvicorn endpoint, POST (wrk, 64 connections)",
                f"{bare.rate:,.0f} req/s",
                "1.00 U",
            )
            run.add("U: bare uvicorn endpoint, GET at 500 req/s: p50", ms(bare_read.p50_ms))
            run.add("  … p99", ms(bare_read.p99_ms))

            print("single-event POSTs", flush=True)
            env = {"BENCH_BOARD": "bench-single", "BENCH_KEY": ladder.server_key}
            single, single_accepted, single_through, single_packing, single_cpu = await ingest(
                ladder,
                run,
                board="bench-single",
                script="post.lua",
                seconds=seconds,
                connections=64,
                per_request=1,
                env=env,
            )
            run.add(
                "single POST, accepted (64 connections)",
                f"{single_accepted:,.0f} /s",
                f"{single_accepted / redis_rate:.2f} R, {single_accepted / bare.rate:.2f} U",
            )
            if single_through is None:
                run.add(
                    "single POST, through all three consumers",
                    "not drained in 300 s",
                    "",
                    "≥ 1.0 R",
                    False,
                )
            else:
                run.add(
                    "single POST, through all three consumers",
                    f"{single_through:,.0f} /s",
                    f"{single_through / redis_rate:.2f} R",
                    "≥ 1.0 R",
                    single_through >= redis_rate,
                )
            run.add("  … events a broker message", f"{single_packing:,.0f}")
            run.add("  … CPU an event, by process, until drained", single_cpu)
            half = max(10.0, single.rate / 2)
            fixed = await asyncio.to_thread(
                load.wrk,
                ladder.api,
                "post.lua",
                seconds=seconds,
                connections=16,
                rate=half,
                env=env | {"BENCH_RUN": "f" + uuid.uuid4().hex[:6]},
            )
            # The latency's baseline: the bare endpoint under the same fixed rate.
            with load.BareServer(port, workers):
                bare_fixed = await asyncio.to_thread(
                    load.wrk, bare_url, "post.lua", seconds=seconds, connections=16, rate=half
                )
            run.add(
                f"U: bare uvicorn endpoint, POST at {bare_fixed.rate:,.0f} req/s: p50",
                ms(bare_fixed.p50_ms),
            )
            run.add("  … p99", ms(bare_fixed.p99_ms))
            run.add(
                f"single POST latency at {fixed.rate:,.0f} req/s (half saturation): p50",
                ms(fixed.p50_ms),
                f"{fixed.p50_ms / bare_fixed.p50_ms:.1f} U",
            )
            run.add(
                "  … p99",
                ms(fixed.p99_ms),
                f"{fixed.p99_ms / bare_fixed.p99_ms:.1f} U",
                "< 10 ms",
                fixed.p99_ms < 10,
            )

            print("batch ingest", flush=True)
            batch_env = {
                "BENCH_BOARD": "bench-batch",
                "BENCH_KEY": ladder.server_key,
                "BENCH_BATCH": "500",
            }
            _, batch_accepted, batch_through, batch_packing, batch_cpu = await ingest(
                ladder,
                run,
                board="bench-batch",
                script="batch.lua",
                seconds=seconds,
                connections=4,
                per_request=500,
                env=batch_env,
            )
            run.add(
                "batch ingest (500 a request, 4 connections), accepted",
                f"{batch_accepted:,.0f} ev/s",
                f"{batch_accepted / redis_rate:.2f} R",
            )
            if batch_through is None:
                run.add(
                    "batch ingest, through all three consumers",
                    "not drained in 300 s",
                    "",
                    "≥ 5 R",
                    False,
                )
            else:
                run.add(
                    "batch ingest, through all three consumers",
                    f"{batch_through:,.0f} ev/s",
                    f"{batch_through / redis_rate:.2f} R",
                    "≥ 5 R",
                    batch_through >= 5 * redis_rate,
                )
            run.add("  … events a broker message", f"{batch_packing:,.0f}")
            run.add("  … CPU an event, by process, until drained", batch_cpu)
            # Redis memory of the whole write path: every key of the batch board.
            per_user, per_event = await write_path_memory(ladder, "bench-batch")
            run.add("Redis bytes per member, all 4 periods' keys of a board", f"{per_user:,.0f} B")
            run.add("Redis bytes per event, idempotency record (24 h)", f"{per_event:,.0f} B")

            print("POST → WebSocket push", flush=True)
            latencies, missed = await probes.push_latency(ladder, ws_samples)
            # A push that never came counts as slower than any that did.
            timed = latencies + [float("inf")] * missed
            run.add(
                f"POST → WebSocket push ({len(timed)} samples): p50",
                ms(probes.percentile(timed, 50)),
            )
            p95 = probes.percentile(timed, 95)
            run.add("  … p95", ms(p95), "", "< 50 ms", p95 < 50)
            run.add("  … max of those that came", ms(max(latencies, default=0.0)))
            run.add(
                f"  … pushes that did not come within {probes.PUSH_WAIT_SECONDS:.0f} s",
                f"{missed} of {len(timed)}",
            )
            if missed:
                run.note(
                    f"{missed} pushes did not come: each is counted as slower than any that did"
                )

            print(f"reads on a board of {members:,} members", flush=True)
            board_key = ladder.keys.region_view("bench-reads", "alltime", "all", "eu")
            memory_before = await probes.used_memory(redis)
            fill_seconds = await probes.fill_board(redis, board_key, members)
            await redis.sadd(ladder.keys.regions("bench-reads", "alltime", "all"), "eu")
            memory_after = await probes.used_memory(redis)
            run.add(
                f"fill {members:,} members (pipelined ZADD of encoded entries)",
                f"{fill_seconds:.1f} s",
            )
            usage = await probes.memory_of(redis, board_key)
            run.add("Redis bytes per member, one board (MEMORY USAGE)", f"{usage / members:.0f} B")
            run.add(
                "Redis bytes per member, one board (INFO used_memory delta)",
                f"{(memory_after - memory_before) / members:.0f} B",
            )
            for name, paths in probes.read_paths("bench-reads", members).items():
                read_env = {"BENCH_PATHS": " ".join(paths)}
                await asyncio.to_thread(
                    load.wrk,
                    ladder.api,
                    "get.lua",
                    seconds=2,
                    connections=4,
                    rate=200,
                    env=read_env,
                )
                result = await asyncio.to_thread(
                    load.wrk,
                    ladder.api,
                    "get.lua",
                    seconds=max(5.0, seconds / 2),
                    connections=4,
                    rate=500,
                    env=read_env,
                )
                if result.non2xx:
                    run.note(f"{name}: {result.non2xx} answers were not 2xx")
                # Ratios to the bare endpoint's answers at the same rate (U's GET rows).
                run.add(
                    f"{name} read at 500 req/s: p50",
                    ms(result.p50_ms),
                    f"{result.p50_ms / bare_read.p50_ms:.1f} U",
                )
                target = "< 2 ms" if name != "top-100" else ""
                run.add(
                    "  … p99",
                    ms(result.p99_ms),
                    f"{result.p99_ms / bare_read.p99_ms:.1f} U",
                    target,
                    None if not target else result.p99_ms < 2,
                )
            await redis.unlink(board_key)

            print("aggregator merge", flush=True)
            merges = {}
            for n in (100_000, members):
                merges[n] = await probes.merge_time(redis, BENCH_PREFIX, n)
                await ladder.clean(BENCH_PREFIX)
                run.add(
                    f"merge of {n:,} dirty members over 8 regions",
                    f"{merges[n]:.1f} s",
                    f"{n / merges[n]:,.0f} /s",
                )
            if len(merges) == 2:
                small, large = sorted(merges)
                run.add(
                    "merge time growth, 10 times the members",
                    f"{merges[large] / merges[small]:.1f} times",
                )

            print("MySQL", flush=True)
            per_row, stored_rate = await probes.mysql_bytes_per_event(settings.mysql_url, 100_000)
            run.add(
                "MySQL bytes per event (data + index, 100,000 rows, ANALYZE)", f"{per_row:,.0f} B"
            )
            run.add("history handler, rows stored (batches of 500)", f"{stored_rate:,.0f} /s")
        finally:
            await ladder.clean(BENCH_PREFIX)
    elapsed = time.monotonic() - began
    print(f"done in {elapsed / 60:.1f} min", flush=True)
    loads = (load_before, os.getloadavg()[0])
    write_report(out, run, the_versions, workers, seconds, elapsed, loads)
    print(f"wrote {out}")
    return 0


async def write_path_memory(ladder: probes.Ladder, board: str) -> tuple[float, float]:
    """(bytes per distinct member of every key of the board but the idempotency records,
    bytes per idempotency record), from MEMORY USAGE."""
    tag = ladder.keys.tag(board)
    other = idem = 0
    idem_count = 0
    batch: list[str] = []
    rest: list[str] = []

    async def measure(keys: list[str]) -> list[int]:
        async with ladder.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.memory_usage(key, samples=0)
            return [int(x or 0) for x in await pipe.execute()]

    async for key in ladder.redis.scan_iter(match=f"{tag}:*", count=5000):
        if key.startswith(f"{tag}:idem:"):
            idem_count += 1
            if idem_count <= 2000:
                batch.append(key)
            continue
        rest.append(key)
        if len(rest) >= 1000:
            other += sum(await measure(rest))
            rest.clear()
    other += sum(await measure(rest)) if rest else 0
    sampled = await measure(batch) if batch else [0]
    idem = int(sum(sampled) / max(1, len(sampled)))
    users = 0
    regions = await ladder.redis.smembers(ladder.keys.regions(board, "alltime", "all"))
    for region in regions:
        view = ladder.keys.region_view(board, "alltime", "all", str(region))
        users += await ladder.redis.zcard(view)
    return other / max(1, users), float(idem)


def write_report(
    out: Path,
    run: Run,
    the_versions: dict[str, str],
    workers: int,
    seconds: float,
    elapsed: float,
    loads: tuple[float, float],
) -> None:
    lines = [
        "# Ladder benchmarks",
        "",
        "Written by `make bench` (`bench/`); every throughput is also given as a ratio to a",
        "baseline measured in the same run, because the machines this runs on are shared and",
        "noisy: **R** is a bare Redis write loop from Python (8 threads, each submission one FCALL",
        "of ZADD GT + ZREVRANK + PFADD + XADD, then two EXPIRE NX), **U** a bare FastAPI/uvicorn",
        "endpoint that answers a constant, with the API's server settings, under the same wrk",
        "load. How the figures are taken, and what bounds the ones that miss their target:",
        "[docs/architecture.md](docs/architecture.md#performance).",
        "",
        f"Run of {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {elapsed / 60:.1f} minutes, load phases "
        f"of {seconds:.0f} s; the API ran {workers} worker process(es). Load average (1 min) "
        f"at the start {loads[0]:.1f}, at the end {loads[1]:.1f}, on {os.cpu_count()} cores"
        + (
            ": the machine was busy with more than Ladder and the bench."
            if max(loads) > (os.cpu_count() or 1)
            else "."
        ),
        "",
        "| figure | value | ratio | target | |",
        "|---|---:|---:|---|---|",
    ]
    for row in run.rows:
        mark = "" if row.met is None else ("met" if row.met else "**missed**")
        lines.append(f"| {row.figure} | {row.value} | {row.ratio} | {row.target} | {mark} |")
    if run.notes:
        lines += ["", "Notes from the run:", ""] + [f"- {n}" for n in run.notes]
    lines += ["", *BOUNDS.splitlines()]
    lines += [
        "",
        "## The machine",
        "",
        f"- {machine()}; every server, every Ladder service and the load generator share it.",
        "- " + ", ".join(f"{k} {v}" for k, v in the_versions.items()),
        "",
        "## Reproducing",
        "",
        "```",
        "make bench            # starts Ladder first if it is not up; about 5 minutes",
        "BENCH_SECONDS=30 make bench   # longer load phases",
        "```",
        "",
        "It uses boards `bench-single`, `bench-batch`, `bench-ws` and `bench-reads` of the running",
        "Ladder, the key prefix `ladder-bench` and the database `ladder_bench`, and removes all of",
        "them at the end (and at the start, after an interrupted run). The million-member board is",
        "filled by pipelined ZADDs of correctly encoded all-time entries straight into its",
        "region's sorted set; the reads then go through the API. Load comes from wrk",
        "(`bench/wrk/*.lua`); the WebSocket probe is a Python client that times, from outside, a",
        "POST until the push it causes arrives.",
        "",
    ]
    out.write_text("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if ready(load_settings()) else 1)
    sys.exit(asyncio.run(main()))
