"""What one write costs the Redis process, in instructions: a private ``redis-server`` run under
valgrind's callgrind, its counters zeroed after a first pass over the users and read after the
measured writes, by board shape (the shapes of :mod:`bench.phases.commands`), beside one
submission of the bare loop R (its FCALL and two ``EXPIRE NX``, bench/load.py) counted alike;
and what the aggregator's merge costs it a member, over 8 and over 300 regions, the members new
to the global view and then each one's score changed (bench/phases/merge.py fills the board).

A count of instructions, unlike a time, does not move with the machine's load (two runs of the
same code agree within about 0.1 %): it is the measure for work on the write's Lua, whose gains
of a few percent a time on a shared machine would not show. It counts what Redis runs, the call
and its Lua and commands with the reading of the request and the writing of the reply, and a
little of the server's own cron.

``python -m bench.phases.instructions`` prints the rows alone (about a minute).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from redis.asyncio import Redis

from bench.load import BASELINE_SOURCE
from bench.phases import merge
from bench.phases.commands import SHAPES, event, redis_server, write
from bench.report import Line, Note, Row
from shared.keys import Keys

# Users of the first pass (more than a hash or sorted set keeps in a listpack, 128 by default, so
# that the boards are encoded as a large board's are), then the writes counted.
USERS = 1000
WRITES = 1000
# Members of the board a merge is counted on, every one dirty (bench/phases/merge.py).
MERGED = 10_000


@dataclass(frozen=True)
class Counted:
    redis: Redis
    pid: int
    out: Path

    async def instructions(self, work: Callable[[], Awaitable[None]]) -> int:
        """The instructions the server ran during ``work``."""
        await asyncio.to_thread(_control, "-z", self.pid)
        await work()
        await asyncio.to_thread(_control, "-d", self.pid)
        dumps = sorted(self.out.glob("cg.*"), key=lambda path: path.stat().st_mtime)
        return _total(dumps[-1])


def _control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, capture_output=True)


def _total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no total in {dump}")


@asynccontextmanager
async def counted_redis() -> AsyncIterator[Counted]:
    """A ``redis-server`` of its own under callgrind, with Ladder's library loaded."""
    with tempfile.TemporaryDirectory() as out:
        valgrind = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p")
        async with redis_server(*valgrind) as (redis, pid):
            yield Counted(redis, pid, Path(out))


async def per_write(
    counted: Counted, shape: str, users: int = USERS, writes: int = WRITES
) -> float:
    """Instructions a steady-state write of ``shape`` costs Redis: every one of ``users`` users
    has an entry in every period already; the mean of ``writes`` writes."""
    board, extra = SHAPES[shape]
    keys, redis = Keys("ins"), counted.redis
    at = datetime.now(UTC) - timedelta(seconds=1)

    async def each(first: int, last: int) -> None:
        for i in range(first, last):
            moment = at + timedelta(microseconds=i)
            await write(redis, keys, board, event(board, extra, i, moment, users))

    await each(0, users)
    total = await counted.instructions(lambda: each(users, users + writes))
    await redis.flushall()
    return total / writes


async def per_baseline(counted: Counted, users: int = USERS, writes: int = WRITES) -> float:
    """Instructions one submission of the bare loop R costs Redis (its members: ``users``)."""
    redis = counted.redis
    await redis.function_load(BASELINE_SOURCE, replace=True)
    board, players, stream = "{ins}:board", "{ins}:players", "{ins}:stream"

    async def submissions(first: int, last: int) -> None:
        for i in range(first, last):
            await redis.fcall("ladder_bench_submit", 3, board, players, stream, i, f"u{i % users}")
            await redis.expire(board, 7 * 86_400, nx=True)
            await redis.expire(players, 7 * 86_400, nx=True)

    await submissions(0, users)
    total = await counted.instructions(lambda: submissions(users, users + writes))
    await redis.flushall()
    return total / writes


async def per_merged_member(
    counted: Counted, regions: int, members: int = MERGED
) -> tuple[float, float]:
    """Instructions the aggregator's merge costs Redis a member, ``members`` users over
    ``regions`` regions, every one of them dirty: (each new to the global view, each one's score
    changed since the merge before, its old entry read, compared and replaced)."""
    redis = counted.redis
    keys = await merge.fill_merge(redis, "ins-merge", members, regions)
    new = await counted.instructions(lambda: merge.merge_all(redis, keys, members))
    await merge.rescore_merge(redis, keys, regions)
    changed = await counted.instructions(lambda: merge.merge_all(redis, keys, members))
    await redis.flushall()
    return new / members, changed / members


async def measure() -> list[Line]:
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing or shutil.which("redis-server") is None:
        return [
            Note("Redis instructions per write: no valgrind or redis-server here, not counted.")
        ]
    async with counted_redis() as counted:
        baseline = await per_baseline(counted)
        rows: list[Line] = [
            Row("Redis instructions per submission of the bare loop R", f"{baseline:,.0f}", "1.0")
        ]
        for shape in SHAPES:
            count = await per_write(counted, shape)
            rows.append(
                Row(
                    f"Redis instructions per steady-state write, {shape}",
                    f"{count:,.0f}",
                    f"{count / baseline:.1f} R's",
                )
            )
        for regions in merge.MERGE_REGIONS:
            new, changed = await per_merged_member(counted, regions)
            for case, count in (("new to the global view", new), ("score changed", changed)):
                rows.append(
                    Row(
                        f"Redis instructions per merged member, {regions} regions, {case}",
                        f"{count:,.0f}",
                        f"{count / baseline:.2f} R's",
                    )
                )
    return rows


if __name__ == "__main__":
    for line in asyncio.run(measure()):
        print(f"{line.figure}: {line.value} {line.ratio}" if isinstance(line, Row) else line.text)
