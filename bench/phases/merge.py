"""The aggregator's merge of dirty members over eight regions, at 100,000 members and at the run's
board size, and how its time grows with the members."""

from __future__ import annotations

from bench import probes
from bench.phases import BENCH_PREFIX, Bench
from bench.report import Line, Row


async def measure(bench: Bench) -> list[Line]:
    rows: list[Line] = []
    merges = {}
    for n in (100_000, bench.options.members):
        merges[n] = await probes.merge_time(bench.redis, BENCH_PREFIX, n)
        await bench.ladder.clean(BENCH_PREFIX)
        rows.append(
            Row(
                f"merge of {n:,} dirty members over 8 regions",
                f"{merges[n]:.1f} s",
                f"{n / merges[n]:,.0f} /s",
            )
        )
    if len(merges) == 2:
        small, large = sorted(merges)
        rows.append(
            Row(
                "merge time growth, 10 times the members",
                f"{merges[large] / merges[small]:.1f} times",
            )
        )
    return rows
