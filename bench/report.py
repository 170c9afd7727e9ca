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
C µs in all cannot go through faster than 2,000,000 / C a second, whoever spends it. The
figure judged against the CPU targets (≤ 250 µs an event batched, ≤ 800 µs single) is Ladder's
processes with their Redis, RabbitMQ and MariaDB; what the load generator, the bench and the
rest of the machine spent is listed after it, outside. Unlike the other figures it is a time,
not a ratio, so it moves with the machine's speed: R, the bare Redis loop, ran 1,622 and 5,680
times a second in two runs a day apart on machines of this kind. The row under R, the CPU a
submission of that loop in Redis and in its client, is this run's yardstick of the machine: a
CPU figure that moved between two runs as much as it did was the machine, not Ladder.

- **Batch ingest is bound by Redis**, one core, and now also by the aggregator. The write
  keeps only the boards, ranks, brackets, names, the idempotency record and the outbox entry;
  the team boards, feed, counters, HyperLogLogs and regions went to the aggregator's derive
  step, 2 to 3 commands an event in batches (the rows "Redis commands per ..."). The write,
  counted as the API sends it (behind its two rate limits), runs about 43 commands on a board
  like `main`, and its time in Redis is mostly not those commands: measured with
  `INFO commandstats` under batch load with the aggregator stopped, a write's `FCALL` took
  about 260 µs of which its inner commands were about 85 µs; the rest is the call and the Lua
  around the commands. The rows "Redis instructions per steady-state write" count it exactly
  (callgrind), in R's a write. It was 12.3 before each rate bucket became a string read
  with the other in one `MGET` (three commands a write where six were) and before the write's
  Lua stopped making tables of keys and fields it never reads (the write alone: 10.9 R's, then
  10.3); 11.5 before the API's call named only the keys the write touches (the lean layout: 15
  keys where 47 were, half the bytes; 19 since each period's regions set joined them, within
  callgrind's spread); 11.0 before each period's result went straight to its
  JSON text and compact answer, with no table for it, its brackets or its buckets. Before
  those two steps (callgrind on a build with symbols), a little more than half was the write's
  own Lua (tables, fields, strings), a quarter its `redis.call`s with the commands they run, a
  tenth reading its 84 keys and arguments (52 now). What would move it: fewer tables a call
  (one a period is left, and one for its old entry), fewer arguments (each costs Redis about
  1,100 instructions, a key 1,800), several events a call for the batch endpoint, boards with
  fewer periods; past one Redis, boards spread over cluster shards (their keys
  share one hash tag per board already).
- **The merge** runs in Redis, a chunk of 60 dirty marks a call. The rows "Redis instructions
  per merged member" count it (callgrind), in R's a member over 8 and over 300 regions. It was
  0.6 and 0.8 before `ladder_merge_v6`, which took off 26 % and 22 % (a call's marks
  come in runs of one region, so that a mark's id is cut at a known place and a run's records
  are read with one `HMGET`, and the writes are planned with fewer strings and tables), and
  more again before each user's regions became one field of a hash a board, read for a whole
  chunk in one `HMGET` (a `SMEMBERS` a user before), and records were compared as strings. Of
  what is left, a fifth is reading the records, a quarter the Lua that plans the writes, more
  than a quarter the `ZADD`s and `HSET`s with the reply. 200,000 members a second leaves about
  5 µs a member, about what one insertion into a million-member sorted set costs here alone.
  The rows "… CPU a member" under each merge say where a member's CPU went and how much of the
  merge's time Redis was at work: not all of it. Between its calls Redis waits for the merger,
  whose own CPU a member the same rows give, most of it in the client's work a call (redis-py
  takes 150 to 250 µs of CPU for one `FCALL`) and the rest splitting and grouping the marks.
  Measured apart on 2026-12-04 (100,000 members, 8 regions, a private `redis-server`): with every
  call's arguments built beforehand, Redis was at work 98 % of the time and merged 107,000 to
  127,000 members a second, against 50,000 to 90,000 for the merger as it is, Redis at work 75
  to 80 %. Keeping calls in flight across rounds (the next `SSCAN` sent early; eight runs in
  turns with the merger as it is), the services' event loop, uvloop, in place of asyncio's
  (five in turns) and a third or fourth call in flight (two runs each) did not move the rate
  beyond the machine's noise. Once a pass's scan of the merging set went on from its cursor
  instead of from the start (2026-12-04, 23:00 UTC: the scans from the start had been a sixth
  of Redis's time in the staleness phase's drain), four calls in flight drained that backlog
  about a tenth faster than two over eight runs side by side; the merge now keeps four out
  while a batch larger than a round drains, and Redis was at work 88 to 91 % of the merges in
  the run of 23:32 UTC.
  What would move it: a board's regions spread over several Redis processes, or a global view
  built by `ZUNIONSTORE` where every user is in one region (docs/architecture.md, "What bounds
  it"), and a cheaper client a call.
- **Staleness after a start with a backlog** (the rows "global view staleness"). Measured by
  `python -m bench.phases.staleness` alone, five runs of 2026-12-06 between 09:28 and 09:34 UTC
  at load averages (1 min) of 4.9 to 6.2 (other work shared the 2 cores), medians with their
  range; the table's rows are a full run's. The backlog is 200,000 users dirty in each of
  `main`'s four periods: 800,000 marks, each a global entry to write (the merge rows above count
  the marks of one period). The global view's `as_of` moves when the batch taken at the start is
  drained, since it vouches for every mark made before it, so a score posted after the start
  shows with an `as_of` after it once the whole backlog and the next batch are merged: its
  staleness is the start-up, the drain and a pass. The merge's first take came 2.0 s after the
  aggregator's start (1.0 to 2.5; its imports alone take 0.9 s of CPU), the drain took 23.1 s
  from it (19.2 to 32.8, 34,600 marks a second) and the worst fresh score showed 25.1 s after
  the start (21.5 to 34.9). Over the drain Redis spent 12.8 µs of CPU a mark (12.0 to 14.7),
  10.2 s for the backlog, and was at work 46 % of it (36 to 50; the rest of the time it waited
  for a core, the machine being loaded, or for the aggregator). 800,000 marks at 10 to 13 µs of
  Redis each are 8 to 10 s of one core before anything else: no schedule of the passes brings
  the drain under 5 s. The passes' bound is not what holds it back: with a budget of 1 s a pass
  instead of 0.25 s the drain took 25.0 and 25.3 s, against 32.8 and 23.1 s in turns with it
  (not kept). Timed pass by pass in one more run (a probe not kept): 69 passes of the backlog,
  each 0.33 s of merge rounds (the 0.25 s budget and the round in hand), then 19 ms of pushes
  (median; 1.7 s in all, 6 % of the drain) and 3 ms to the next pass, so what any schedule of
  the passes could win back is under a tenth. A py-spy profile of the aggregator over that drain
  put 40 % of its merge ticker's CPU in those pushes (the top-10 looks at the global view and
  the eight regions in four periods, 36 views a pass, and the global brackets) and 57 % in the
  merge rounds: CPU-heavy, short in time. The live views held meanwhile: the hot view's `as_of`
  at most 2.2 s old (2.0 to 2.2), a fresh score's global entry within 2.4 s and its region's
  top-10 push within 2.4 s (1.2 to 3.0) at these loads. The phase's rows now say where the time
  goes: the first take, the drain's rate, Redis's CPU a mark and its share of the drain. What
  would move it: the merge's rate (above) past about 170,000 marks a second, or an `as_of` kept
  per period that moves once the period's part of the backlog is merged and a sweep of the fresh
  marks made since is (the backlog drained a period at a time: the first period would catch up
  in a quarter of the drain, the last no sooner), or per region or user, so that fresh scores
  show ahead of a backlog without the view claiming the backlog merged.
- **The aggregator's share of Redis.** With `SLOWLOG` logging every command while one
  aggregator drained a backlog of 14,000 batch-ingested events of board `main` (the commands a
  function runs are logged too, which makes every figure somewhat high), its calls took about
  140 µs of Redis an event for the merge (each event dirties a member in four periods; on a
  private `redis-server` the merge alone costs 15 to 18 µs a member), 120 µs for the MVP
  contributions, 50 µs for the derive step and 25 µs for the hot view. The contributions and
  the derive step now go in calls of up to 15 and 25 events, the derive step naming each
  period's keys once a call (its Redis time an event fell by about a fifth, the aggregator's
  Python for it by about a third); what is left is their commands, a few an event and period,
  which a call of many events shares only where a user comes back within it. What would move
  it: fewer views kept an event (periods, MVPs), or a global view that Redis can combine from
  whole regional boards (`ZUNIONSTORE`) rather than user by user.
- **Single POSTs are bound by the API's Python per request**, a large share of their CPU (the
  single POST's row "CPU an event, by process"), well above the bare endpoint's (2 cores / U).
  Group commit shares the Redis round trip among concurrent POSTs, and the route is called
  without FastAPI's request handler. A py-spy profile of a worker under this load
  (docs/architecture.md): about a quarter in Starlette's and FastAPI's middleware and routing,
  a tenth in uvicorn sending the response, a tenth building the write's keys and arguments, a
  tenth the pipelined write through redis-py. What would move it: fewer, larger requests (the
  batch endpoint), or more cores.
- **Latency at half saturation.** The machine is still saturated by the rest of the pipeline
  (consumers, broker, Redis) while the API answers half the rate it can accept: p99 is
  scheduling delay on two shared cores, far above p50. The bare endpoint under the same rate
  (U's POST rows) is the floor; the ratios to it are Ladder's own cost, which shrinks with the
  API's per-request CPU above. The pipeline's CPU an event also grows as the rate falls: at
  about 350 POSTs a second each relay message, consumer batch and Redis call carries a few
  events instead of about seventy, and all processes took about 4,400 µs an event against the
  saturated phase's 1,600 (docs/architecture.md, "What bounds it"), so half the API's rate
  nearly fills the two cores. The history writer and the aggregator, off the push path, wait
  out their 50 ms batch window for that reason; the notifier, on it, hands a batch over after
  a 3 ms pause. A write also waits for whatever Lua call Redis is running: the aggregator's
  merge, derive and live calls are cut to 1 to 3 ms of Redis each and sent one after another,
  not pipelined (Redis runs a client's pipeline back to back); at about 435 POSTs a second
  that took the p99 from 26 to 30 ms down to 16 ms (docs/architecture.md, "Latency").
  Measured again on 2026-12-04 (19:47 UTC, `make up`, wrk at a fixed rate, 15 s, twice each):
  at about 830 POSTs a second a relay message carried 7 events, and Ladder spent about
  1,600 µs an event (API 520, Redis 350 to 480, RabbitMQ 170, notifier 160, aggregator 180,
  history 130) against 693 µs at saturation. The relay waits at least 5 or 10 ms before its
  next read: 9 and 10 events a message, the CPU an event within the noise (1,560 to 1,610 µs),
  so it was not kept (a lone event still goes out at once; those after it would wait that
  long). A py-spy profile of an API worker at that rate: 44 % of its samples in the event loop's
  own C code (uvloop: socket reads and writes, polling), 16 % in a request's way through
  Starlette and FastAPI, 8 % the relay, 5 % the group commit. What would move it: fewer,
  larger requests (the batch endpoint), or a rate high enough to fill the batches.
- **Reads on the million-member board.** Each read validates its query in one step and
  answers with one Redis Function call (O(log n): `ZREVRANK`, `ZREVRANGE`); the friends scope
  takes two (the friend set is a key of the user). In the run of 2026-12-02 16:18 UTC (load
  average 0.8 at its start) the p50s were 2 to 3 U and the p99s about 3 U; in that of
  2026-12-03 06:19 (1.2 at its start, 2.9 at its end, just after a CI run) 3 to 8 U and 4 to
  8 U. The ratios lean on the bare endpoint's p99, which moves more than the reads' own: in two
  runs 15 minutes apart on 2026-12-03 (09:05 and 09:20 UTC) it was 1.80 ms and 5.92 ms, the
  rank and around-me p99s 10 and 8.7 ms, then 7.7 and 6.9 ms, so 5.6 and 4.8 U, then 1.3 and
  1.2 U. A p99 within 2 U in one run is not yet a p99 that stays there.
  The p99s were 16 to 63 U while the hot view's tick read every user of its window: after the
  batch phase those calls held Redis 45 to 100 ms a second, and the reads waited behind them
  (docs/architecture.md, "Live views"). Each window now keeps its users ranked, and no hot call
  holds Redis more than a few milliseconds. What is left is the API's own cost. The board page
  and the standing are called without FastAPI's request handler, as the score POST is, and
  since 2026-12-05 without the walk over the app's routers that found them (`DirectPaths`, in
  the router's place inside the middleware and the error handlers); a query string validated
  once is not validated again, the current period's window is kept while it is current (a
  season's was a walk of its schedule, 1.4 ms), and the entries are built without a call each.
  Their one Redis call goes on a connection the reads keep checked out of the pool (`fcall_ro`
  in `shared/redis.py`), without redis-py's checkout, release and wrapper around
  `execute_command`, and every command of Ladder's connections is sent without the task
  redis-py makes of a send to time it: the call alone (3,000 in a row, medians of five rounds)
  went from 63 to 31 µs of CPU, 10 of them the send's task. Measured in-process by
  `python -m bench.read_cpu` (100,000 members; the code before and after in turn, eight runs
  each, load average 2 to 6; the client's own CPU in every row): a rank read 494 → 292 µs
  (medians; the bare endpoint 156 and 160), around-me 508 → 352, top-100 684 → 508; the app
  alone (called without an HTTP client) made about 800 → 288 Python calls a rank read, the bare
  endpoint 240. What is left, in a py-spy profile of the app alone serving around-me reads: the
  Redis call about half (the reply read under its timeout, the send's system call, the idle
  connection's health check, packing), the middleware above the shortcut (Starlette's,
  FastAPI's and Ladder's three) about a seventh, the entries and the standing's body about an
  eighth, the credential, board, query and view about a tenth, the JSON and its sending a
  twentieth. What would move it: the middleware for these two routes, a Redis client that reads
  replies without a stream and a timer a call, or more cores.
- **One primary against three, and `WAIT`** (the rows "1 primary" and "3 primaries", ratios
  P to one primary with a replica and no `WAIT`, on the phase's private servers). On two
  cores, three primaries and their replicas share the same two cores with the API and wrk, so
  the cluster cannot give Redis more CPU: the per-primary shares show the load spread about
  evenly over the three, and the totals stay near one primary's. On a machine with a core or
  more for each primary (and the API's workers on cores of their own), batch ingest, which one
  Redis core bounds, would scale with the primaries until the API's CPU bounds it; single POSTs,
  bound by the API's Python, would not move. `WAIT 1` adds a replica's acknowledgement to each
  round trip: on loopback a fraction of a millisecond, hidden under load by the group commit
  (many writes share one `WAIT`) and by batches (one `WAIT` a primary a batch); across machines
  it is a network round trip more a write.
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
        "make bench            # starts Ladder first if it is not up; about 10 minutes",
        "BENCH_SECONDS=30 make bench   # longer load phases",
        "python -m bench.phases.staleness   # one phase alone, on private servers; no file written",
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
        "view shows them with an `as_of` at or after them (one poll for all that wait, every",
        "50 ms), the hot view's `as_of` age and a region's top-10 push meanwhile, when the",
        "merge first took the backlog, and Redis's CPU (`INFO cpu`) from then to the drain.",
        "`python -m bench --help` names the phases that run alone so. Load comes from wrk",
        "(`bench/wrk/*.lua`); the WebSocket probe is a Python client that times, from outside, a",
        "POST until the push it causes arrives. The cluster rows (`python -m bench.phases.cluster`",
        "alone) come from private redis-servers (one primary with a replica; three primaries with",
        "one each) and an API process of their own with an unreachable broker, six boards two on",
        "each primary.",
        "",
    ]
    out.write_text("\n".join(lines))
