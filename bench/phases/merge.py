"""The aggregator's merge of dirty members over 8 and over 300 regions (a board after a day of
test runs), at 100,000 members and at the run's board size, and how its time grows with the
members."""

from __future__ import annotations

from bench import probes
from bench.phases import BENCH_PREFIX, Bench
from bench.report import Line, Row

TARGET = 200_000  # members/s, with 8 regions and with 300 (issue 14)


async def measure(bench: Bench) -> list[Line]:
    rows: list[Line] = []
    for regions in probes.MERGE_REGIONS:
        merges = {}
        for n in (100_000, bench.options.members):
            merges[n] = await probes.merge_time(bench.redis, BENCH_PREFIX, n, regions)
            await bench.ladder.clean(BENCH_PREFIX)
            rate = n / merges[n]
            rows.append(
                Row(
                    f"merge of {n:,} dirty members over {regions} regions",
                    f"{merges[n]:.1f} s",
                    f"{rate:,.0f} /s",
                    f"≥ {TARGET:,} /s",
                    rate >= TARGET,
                )
            )
        if len(merges) == 2:
            small, large = sorted(merges)
            rows.append(
                Row(
                    f"merge time growth, 10 times the members, {regions} regions",
                    f"{merges[large] / merges[small]:.1f} times",
                )
            )
    return rows
