"""One ingest measurement, shared by the single-event and the batch phases: load a board with
wrk and follow its events through every consumer."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from bench import cpu, load
from bench.load import WrkResult
from bench.probes import Ladder
from bench.report import Line, Note, Row


@dataclass(frozen=True)
class Workload:
    """What wrk sends: ``script`` (``bench/wrk``) on ``connections``, ``per_request`` events a
    request, configured by ``env``."""

    board: str
    script: str
    connections: int
    per_request: int
    env: dict[str, str]


@dataclass(frozen=True)
class Ingest:
    result: WrkResult
    accepted: float  # events accepted a second
    through: float | None  # events a second all the way through every consumer; None: not drained
    packing: float  # events a broker message
    cpu: str  # the CPU an event of each process group until drained
    cpu_ladder: float  # µs of CPU an event of Ladder's processes and engines until drained
    notes: list[Note]


async def ingest(ladder: Ladder, work: Workload, seconds: float) -> Ingest:
    """Load a board with wrk and follow the events through the consumers."""
    url, board, script, connections = ladder.api, work.board, work.script, work.connections
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
        env=work.env | {"BENCH_RUN": "w" + uuid.uuid4().hex[:6]},
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
        env=work.env | {"BENCH_RUN": "m" + uuid.uuid4().hex[:6]},
    )
    total = await ladder.settled(board)
    accepted = total - count0
    sent = result.requests * work.per_request
    notes: list[Note] = []
    if accepted < sent * 0.99:
        notes.append(
            Note(
                f"{board}: {sent - accepted} of {sent} events were refused (HTTP non-2xx "
                f"{result.non2xx}); rate limits? make bench starts Ladder with LADDER_KEY_RATE "
                "high"
            )
        )
    drained_at = await ladder.drained(board, total, consumed0, accepted, time.monotonic() + 300)
    through = None if drained_at is None else accepted / (drained_at - started)
    totals = cpu.spent(cpu0, cpu.snapshot())
    spent = cpu.per_event(totals, max(1, accepted))
    events, messages = (b - a for a, b in zip(relayed0, await ladder.relayed(), strict=True))
    return Ingest(
        result,
        accepted / result.seconds,
        through,
        events / max(1.0, messages),
        spent,
        cpu.ladder_per_event(totals, max(1, accepted)),
        notes,
    )


def rows(
    run: Ingest,
    accepted: Row,
    name: str,
    redis_rate: float,
    *,
    unit: str,
    target: str,
    times: float,
    cpu_target: float,
) -> list[Line]:
    """An ingest's rows: its notes, ``accepted``, how fast the events went through all three
    consumers (the target is ``times`` R), how many went in a broker message, the CPU each cost
    (the target: at most ``cpu_target`` µs an event, Ladder's processes and engines)."""
    if run.through is None:
        through = Row(
            f"{name}, through all three consumers", "not drained in 300 s", "", target, False
        )
    else:
        through = Row(
            f"{name}, through all three consumers",
            f"{run.through:,.0f} {unit}",
            f"{run.through / redis_rate:.2f} R",
            target,
            run.through >= times * redis_rate,
        )
    return [
        *run.notes,
        accepted,
        through,
        Row("  … events a broker message", f"{run.packing:,.0f}"),
        Row(
            "  … CPU an event, by process, until drained",
            run.cpu,
            "",
            f"≤ {cpu_target:,.0f} µs",
            run.cpu_ladder <= cpu_target,
        ),
    ]
