"""The bench's figures: each phase's rows printed as the phase ends, and BENCHMARKS.md written
from them all."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.machine import machine


@dataclass(frozen=True)
class Row:
    figure: str
    value: str
    ratio: str = ""
    target: str = ""
    met: bool | None = None


@dataclass(frozen=True)
class Note:
    """Something that went wrong in a run, said under the table."""

    text: str


Line = Row | Note


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def take(self, lines: Iterable[Line]) -> None:
        """Keep a phase's rows and notes, in their order, and print each."""
        for line in lines:
            if isinstance(line, Note):
                self.notes.append(line.text)
                print(f"  note: {line.text}", flush=True)
                continue
            self.rows.append(line)
            mark = "" if line.met is None else ("  [met]" if line.met else "  [MISSED]")
            print(
                f"  {line.figure:<58} {line.value:>26} {line.ratio:>10} {line.target}{mark}",
                flush=True,
            )


def ms(value: float) -> str:
    if value == float("inf"):
        return "no push"
    return f"{value:.2f} ms" if value < 10 else f"{value:.0f} ms"


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
  The rows "Redis commands per steady-state write" count what one write runs (the rate
  limits' 6 not included), against the 4 of the baseline's FCALL; its cost in Redis grows with
  the count of commands (each `redis.call` from Lua costs about as much again as the command
  itself). Of a write on a board like `main` (four periods, teams), the team boards take about
  a quarter, the distinct-score sets of dense ranks another, the period counters and the feed a
  sixth. What would move it: those derived views kept by the aggregator, in batches, rather
  than by the write; boards with fewer periods; past one Redis, boards spread over cluster
  shards (their keys share one hash tag per board already).
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


def write_report(
    out: Path,
    report: Report,
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
    for row in report.rows:
        mark = "" if row.met is None else ("met" if row.met else "**missed**")
        lines.append(f"| {row.figure} | {row.value} | {row.ratio} | {row.target} | {mark} |")
    if report.notes:
        lines += ["", "Notes from the run:", ""] + [f"- {n}" for n in report.notes]
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
        "make bench            # starts Ladder first if it is not up; about 6 minutes",
        "BENCH_SECONDS=30 make bench   # longer load phases",
        "```",
        "",
        "It uses boards `bench-single`, `bench-batch`, `bench-ws` and `bench-reads` of the running",
        "Ladder, the key prefix `ladder-bench` and the database `ladder_bench`, and removes all of",
        "them at the end (and at the start, after an interrupted run). The million-member board is",
        "filled by pipelined ZADDs and HSETs of all-time entries and their records, in the",
        "layout of shared/ranking.py, straight into its region's view; the reads then go through",
        "the API. The command counts come from a private redis-server of their own. The",
        "staleness after a start with a backlog (`python -m bench.phases.staleness` alone) runs on",
        "a private stack: a redis-server of its own filled with 200,000 dirty users of board",
        "`main` in each of its four periods, then the API and the aggregator as processes (the",
        "broker under a prefix of its own, removed after); it times fresh POSTs until the global",
        "view shows them with an `as_of` at or after them, the hot view's `as_of` age and a",
        "region's top-10 push meanwhile. Load comes from wrk",
        "(`bench/wrk/*.lua`); the WebSocket probe is a Python client that times, from outside, a",
        "POST until the push it causes arrives.",
        "",
    ]
    out.write_text("\n".join(lines))
