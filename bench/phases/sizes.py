"""What a score costs in storage: Redis bytes of the write path (taken on the batch board, after
its ingest), and MySQL bytes and the history handler's rate of storing rows."""

from __future__ import annotations

from bench import probes
from bench.phases import Bench
from bench.probes import Ladder
from bench.report import Line, Row


async def write_path(bench: Bench, board: str) -> list[Line]:
    """Redis memory of the whole write path: every key of ``board``."""
    per_user, per_event = await write_path_memory(bench.ladder, board)
    return [
        Row("Redis bytes per member, all 4 periods' keys of a board", f"{per_user:,.0f} B"),
        Row("Redis bytes per event, idempotency record (24 h)", f"{per_event:,.0f} B"),
    ]


async def mysql(bench: Bench) -> list[Line]:
    mysql_url = bench.ladder.settings.mysql_url
    per_row, stored_rate = await probes.mysql_bytes_per_event(mysql_url, 100_000)
    return [
        Row("MySQL bytes per event (data + index, 100,000 rows, ANALYZE)", f"{per_row:,.0f} B"),
        Row("history handler, rows stored (batches of 500)", f"{stored_rate:,.0f} /s"),
    ]


async def write_path_memory(ladder: Ladder, board: str) -> tuple[float, float]:
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
