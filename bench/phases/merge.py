"""The aggregator's merge of dirty members over 8 and over 300 regions (a board after a day of
test runs), at 100,000 members and at the run's board size, and how its time grows with the
members; and the probes that fill a board for it (the instruction count of a merged member,
bench/phases/instructions.py, fills it alike)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from bench import cpu
from bench.phases import BENCH_PREFIX, Bench
from bench.probes import layout_entries
from bench.report import Line, Row
from services.aggregator.merge import Merger
from shared.boards import Board
from shared.keys import Keys, dirty_member
from shared.ranking import member, parse_record, record

TARGET = 200_000  # members/s, with 8 regions and with 300, at least
# Regions of the board the merge is measured on: a few, and as many as a day of test runs left.
MERGE_REGIONS = (8, 300)
MERGE_BOARD = Board(board_id="merge", periods=["alltime"], notify_top=[1, 10, 100])


async def measure(bench: Bench) -> list[Line]:
    rows: list[Line] = []
    for regions in MERGE_REGIONS:
        merges = {}
        for n in (100_000, bench.options.members):
            merged = await merge_time(bench.redis, BENCH_PREFIX, n, regions)
            merges[n] = merged.seconds
            await bench.ladder.clean(BENCH_PREFIX)
            rate = n / merged.seconds
            rows.append(
                Row(
                    f"merge of {n:,} dirty members over {regions} regions",
                    f"{merged.seconds:.1f} s",
                    f"{rate:,.0f} /s",
                    f"≥ {TARGET:,} /s",
                    rate >= TARGET,
                )
            )
            rows.append(Row("  … CPU a member", merged.profile(n)))
        if len(merges) == 2:
            small, large = sorted(merges)
            rows.append(
                Row(
                    f"merge time growth, 10 times the members, {regions} regions",
                    f"{merges[large] / merges[small]:.1f} times",
                )
            )
    return rows


@dataclass(frozen=True)
class Merged:
    """One merge measured: its time, and the CPU that Redis and the merger (this process, where
    the merge runs as the aggregator runs it) spent on it."""

    seconds: float
    redis: float
    merger: float

    def profile(self, members: int) -> str:
        """``Redis 9.8 µs, the merger 7.1 µs; Redis busy 77 % of the merge``: where a member's
        CPU went, and how much of the merge's time Redis, whose core bounds it, was at work
        (the rest it waited for the merger's next call)."""
        return (
            f"Redis {self.redis / members * 1e6:.1f} µs, the merger "
            f"{self.merger / members * 1e6:.1f} µs; Redis busy "
            f"{100 * self.redis / self.seconds:.0f} % of the merge"
        )


async def merge_time(redis: Redis, prefix: str, members: int, regions: int = 8) -> Merged:
    """The aggregator's merge of a global board of ``members`` users spread over ``regions``
    regions (:func:`fill_merge`), on a bench-only key prefix, timed, with the CPU of Redis and of
    the merger. The regional boards are filled first, not timed."""
    keys = await fill_merge(redis, prefix, members, regions)
    before, started, own = cpu.snapshot(), time.monotonic(), time.process_time()
    await merge_all(redis, keys, members)
    seconds, merger = time.monotonic() - started, time.process_time() - own
    return Merged(seconds, cpu.spent(before, cpu.snapshot()).get("Redis", 0.0), merger)


async def merge_all(redis: Redis, keys: Keys, members: int) -> None:
    """The merge of :data:`MERGE_BOARD`, all of it; an error unless it wrote ``members``."""
    written = await Merger(redis, keys).merge_board(MERGE_BOARD)
    if written != members:
        raise RuntimeError(f"the merge wrote {written} entries, not {members}")


async def fill_merge(redis: Redis, prefix: str, members: int, regions: int) -> Keys:
    """:data:`MERGE_BOARD`'s regional views of ``members`` users spread over ``regions``
    regions (each user in one, the users' regions hash saying so, as the derive step leaves
    it), every one of them dirty (the worst case: all moved since the last merge)."""
    keys, board_id = Keys(prefix), MERGE_BOARD.board_id
    rng = random.Random(3)
    chunk = 1000
    for start in range(0, members, chunk * 20):
        async with redis.pipeline(transaction=False) as pipe:
            for offset in range(start, min(members, start + chunk * 20), chunk):
                users = range(offset, min(members, offset + chunk))
                by_region: dict[str, list[str]] = {}
                for i in users:
                    by_region.setdefault(f"r{i % regions}", []).append(f"u{i}")
                for region, ids in by_region.items():
                    mapping, ties = layout_entries(rng, ids)
                    view = keys.region_view(board_id, "alltime", "all", region)
                    pipe.zadd(view, mapping)
                    pipe.hset(Keys.ties(view), mapping=ties)
                    pipe.sadd(
                        keys.dirty(board_id),
                        *(dirty_member("alltime", "all", region, u) for u in ids),
                    )
                    pipe.hset(keys.user_regions(board_id), mapping=dict.fromkeys(ids, region))
            await pipe.execute()
    names = (f"r{r}" for r in range(regions))
    await redis.sadd(keys.regions(board_id, "alltime", "all"), *names)
    return keys


async def rescore_merge(redis: Redis, keys: Keys, regions: int) -> None:
    """Every member of :data:`MERGE_BOARD`'s regional views (:func:`fill_merge`) with its
    signed score one more, its record with it, and dirty again: the next merge changes every
    global entry that the one before made (the steady state's case: an old entry read, compared
    and replaced)."""
    board_id = MERGE_BOARD.board_id
    for r in range(regions):
        region = f"r{r}"
        view = keys.region_view(board_id, "alltime", "all", region)
        found: dict[str, str] = cast(dict[str, str], await redis.hgetall(Keys.ties(view)))
        records: dict[Any, str] = {}
        scores: dict[str, float] = {}
        for user, raw in found.items():
            tie, signed, meta = parse_record(raw)
            records[user] = record(tie, signed + 1, meta)
            scores[member(tie, user)] = signed + 1
        marks = [dirty_member("alltime", "all", region, user) for user in records]
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zadd(view, scores)
            pipe.hset(Keys.ties(view), mapping=records)
            pipe.sadd(keys.dirty(board_id), *marks)
            await pipe.execute()
