"""What Ladder spends doing nothing: the CPU of its processes and engines, with no event coming,
first with the boards the bench defined, then with ``IDLE_BOARDS`` more. Games define a board
a level, a track or a map; the relays and the aggregator's tickers go over every board, so an
idle board must cost them next to nothing (docs/architecture.md, "Boards with nothing to do")."""

from __future__ import annotations

import asyncio

from bench import cpu
from bench.phases import Bench
from bench.report import Line, Note, Row

IDLE_BOARDS = 1000
# Seconds each share is measured over: several of every ticker's periods (0.25 to 2 s) and one
# of the live views' pass over all MVPs (30 s).
WINDOW = 30.0
# Seconds for every process to see the boards defined (the catalog is read again every 2 s) and
# for the aggregator's first passes over them (each new board's views computed once) to end.
SETTLE = 40.0
PREFIX = "bench-idle-"


async def measure(bench: Bench) -> list[Line]:
    ladder = bench.ladder
    before = len(await ladder.redis.hkeys(ladder.keys.boards))
    alone = await shares(WINDOW)
    names = [f"{PREFIX}{i}" for i in range(IDLE_BOARDS)]
    try:
        for name in names:
            await ladder.define(name)
        await asyncio.sleep(SETTLE)
        many = await shares(WINDOW)
    finally:
        left = await remove(bench, names)
    rows: list[Line] = [
        Row(f"idle CPU with {boards(before)} defined, share of a core", described(alone)),
        Row(
            f"idle CPU with {boards(before + IDLE_BOARDS)} defined, share of a core",
            described(many),
            f"{total(many) / max(total(alone), 1e-9):.1f} times",
        ),
    ]
    if left:
        rows.append(Note(f"{left} of the idle phase's boards were still being deleted at its end"))
    return rows


async def shares(seconds: float) -> dict[str, float]:
    """Each group's CPU over ``seconds``, as a share of one core."""
    before = cpu.snapshot()
    await asyncio.sleep(seconds)
    return {name: spent / seconds for name, spent in cpu.spent(before, cpu.snapshot()).items()}


def boards(count: int) -> str:
    return f"{count:,} board" if count == 1 else f"{count:,} boards"


def total(found: dict[str, float]) -> float:
    return sum(share for name, share in found.items() if name not in cpu.OUTSIDE)


def described(found: dict[str, float]) -> str:
    """``12 %: API 9 %, aggregator 2 %, ...``: Ladder's processes and engines, largest first."""
    inside = sorted(
        ((name, share) for name, share in found.items() if name not in cpu.OUTSIDE),
        key=lambda item: -item[1],
    )
    parts = ", ".join(f"{name} {share:.1%}" for name, share in inside if share >= 0.0005)
    return f"{total(found):.1%}: {parts}"


async def remove(bench: Bench, names: list[str]) -> int:
    """Delete the phase's boards (their definitions from MySQL and Redis, their keys purged);
    how many were still defined after waiting for the deletions, at most a minute."""
    ladder = bench.ladder
    for name in names:
        response = await ladder.http.delete(
            f"{ladder.api}/v1/boards/{name}", params={"purge": "true"}, headers=ladder.auth(True)
        )
        if response.status_code not in (202, 404):
            response.raise_for_status()
    for _ in range(60):
        defined = [str(b) for b in await ladder.redis.hkeys(ladder.keys.boards)]
        left = [b for b in defined if b.startswith(PREFIX)]
        if not left:
            return 0
        await asyncio.sleep(1.0)
    return len(left)
