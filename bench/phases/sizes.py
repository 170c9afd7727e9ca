"""What a score costs in storage: Redis bytes of the write path (taken on the batch board, after
its ingest), and MySQL bytes and the history handler's rate of storing rows."""

from __future__ import annotations

from dataclasses import dataclass

from bench import probes
from bench.phases import Bench
from bench.probes import Ladder
from bench.report import Line, Row

KEPT_TARGET = 250
"""Redis bytes kept per accepted event at most (the target): its record and any seen keys."""


async def write_path(bench: Bench, board: str) -> list[Line]:
    """Redis memory of the whole write path: every key of ``board``."""
    per_user, kept = await write_path_memory(bench.ladder, board)
    return [
        Row("Redis bytes per member, all 4 periods' keys of a board", f"{per_user:,.0f} B"),
        Row("Redis bytes per event, idempotency record (24 h)", f"{kept.record:,.0f} B"),
        Row(
            "Redis bytes kept per event: record and seen keys (24 h)",
            f"{kept.total:,.0f} B",
            target=f"≤ {KEPT_TARGET} B",
            met=kept.total <= KEPT_TARGET,
        ),
    ]


async def mysql(bench: Bench) -> list[Line]:
    mysql_url = bench.ladder.settings.mysql_url
    per_row, stored_rate = await probes.mysql_bytes_per_event(mysql_url, 100_000)
    return [
        Row("MySQL bytes per event (data + index, 100,000 rows, ANALYZE)", f"{per_row:,.0f} B"),
        Row("history handler, rows stored (batches of 500)", f"{stored_rate:,.0f} /s"),
    ]


@dataclass(frozen=True)
class Kept:
    """What an accepted event leaves in Redis for a day, from MEMORY USAGE: its record (the
    idempotency answer, holding the consumers' seen marks), and what seen keys of their own
    (the layout before) add, spread over the records."""

    record: float
    seen: float

    @property
    def total(self) -> float:
        return self.record + self.seen


SAMPLED = 2000


async def write_path_memory(ladder: Ladder, board: str) -> tuple[float, Kept]:
    """(bytes per distinct member of every key of the board but the events' records and seen
    keys, the bytes each event keeps), from MEMORY USAGE."""
    tag = ladder.keys.tag(board)
    other = 0
    per_event: dict[str, list[str]] = {"idem": [], "seen": []}
    counts = {"idem": 0, "seen": 0}
    rest: list[str] = []

    async def measure(keys: list[str]) -> list[int]:
        async with ladder.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.memory_usage(key, samples=0)
            return [int(x or 0) for x in await pipe.execute()]

    async for key in ladder.redis.scan_iter(match=f"{tag}:*", count=5000):
        kind = key[len(tag) + 1 :].split(":", 1)[0]
        if kind in per_event:
            counts[kind] += 1
            if counts[kind] <= SAMPLED:
                per_event[kind].append(key)
            continue
        rest.append(key)
        if len(rest) >= 1000:
            other += sum(await measure(rest))
            rest.clear()
    other += sum(await measure(rest)) if rest else 0
    mean = {}
    for kind, sample in per_event.items():
        sizes = await measure(sample) if sample else [0]
        mean[kind] = sum(sizes) / len(sizes)
    seen = mean["seen"] * counts["seen"] / max(1, counts["idem"])
    users = 0
    regions = await ladder.redis.smembers(ladder.keys.regions(board, "alltime", "all"))
    for region in regions:
        view = ladder.keys.region_view(board, "alltime", "all", str(region))
        users += await ladder.redis.zcard(view)
    return other / max(1, users), Kept(mean["idem"], seen)
