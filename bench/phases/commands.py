"""What one write asks of Redis: the commands a steady-state write runs, by board shape, as the API
sends it (``ladder_write_v13``, lean: the write behind the user's and the credential's rate limits),
counted exactly (``INFO commandstats``) on a private ``redis-server`` that nothing else talks to;
and what the aggregator's derive step (``ladder_derive_v5``, in batches of ``DERIVE_BATCH``) then
runs per event for the views the write leaves to it. A count, not a
time: it does not vary with the machine or its load, so that a change of the write's layout
shows here as the same figure on every run.

``python -m bench.phases.commands`` prints the counts alone, in seconds.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from redis.asyncio import Redis

from bench.ports import consecutive_free
from bench.report import Line, Note, Row
from services.aggregator.derive import Derive
from services.api.write.limits import Quota
from services.api.write.submit import Call
from shared.boards import Board
from shared.events import ScoreAccepted
from shared.functions import DERIVE_FUNCTION
from shared.keys import Keys
from shared.redis import open_redis
from shared.submit import SubmitEvent, submit_call

# Board shapes: each a definition and what its events carry.
SHAPES: dict[str, tuple[Board, dict[str, Any]]] = {
    "incr, 4 periods, with teams (like main)": (Board(board_id="c-incr"), {"team_id": "red"}),
    "best, 4 periods": (Board(board_id="c-best", operator="best"), {}),
    "best, 4 periods, subscore and metadata": (
        Board(board_id="c-sub", operator="best", subscore_order="asc"),
        {"subscore": 0, "metadata": orjson.dumps({"car": "wombat-gt", "replay": "r-9f2c"})},
    ),
}
USERS = 200
WRITES = 2000
DERIVE_BATCH = 100
_SKIPPED = {"fcall", "info", "config", "function"}


@asynccontextmanager
async def redis_server(*under: str) -> AsyncIterator[tuple[Redis, int]]:
    """A ``redis-server`` of its own on a free loopback port, with Ladder's library loaded, run
    under ``under`` (a command and its arguments, valgrind's say; none: as it is): its client,
    and the pid of the process started."""
    port = consecutive_free(1, 20_000, 30_000)[0]
    binary = shutil.which("redis-server") or "redis-server"
    with tempfile.TemporaryDirectory() as workdir:
        server = await asyncio.create_subprocess_exec(
            *under,
            *(binary, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", workdir),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await _wait_for(port)
            async with open_redis(f"redis://127.0.0.1:{port}/0", load_functions=True) as redis:
                yield redis, server.pid
        finally:
            server.terminate()
            await server.wait()


@asynccontextmanager
async def private_redis() -> AsyncIterator[Redis]:
    """A ``redis-server`` of its own on a free loopback port, with Ladder's library loaded."""
    async with redis_server() as (redis, _):
        yield redis


async def _wait_for(port: int) -> None:
    for _ in range(600):  # under valgrind the server takes seconds to start
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return
    raise RuntimeError(f"redis-server on port {port} did not start")


def event(
    board: Board, extra: dict[str, Any], i: int, at: datetime, users: int = USERS
) -> SubmitEvent:
    """The ``i``-th write's event: one of ``users`` users, its value growing with ``i``."""
    subscore = extra.get("subscore")
    return SubmitEvent(
        event_id=f"e{i}",
        user_id=f"u{i % users}",
        region="eu",
        team_id=extra.get("team_id"),
        display_name=None,
        # Growing values: on best boards every write improves, the costlier path.
        value=1 + i,
        occurred_at=at,
        accepted_at=at,
        subscore=None if subscore is None else subscore - i,
        metadata=extra["metadata"].decode() if "metadata" in extra else None,
    )


async def write(redis: Redis, keys: Keys, board: Board, submitted: SubmitEvent) -> None:
    """One write of ``submitted`` as the API makes it: the call of services/api/write/submit.py,
    under rate limits no write of the bench reaches (they cost the same taken as refused)."""
    call_keys, args = submit_call(
        keys,
        board,
        submitted,
        body_hash="h",
        idempotency_ttl=60,
        outbox_max=1_000_000,
        feed_length=100,
        journaled=False,
    )
    call = Call(submitted.event_id, submitted.user_id, call_keys, args)
    quota = Quota(keys, board.board_id, "key:bench", user_rate=1e9, key_rate=1e9)
    now_ms = int(time.time() * 1000)
    answer = await redis.execute_command("FCALL", *call.command(quota, now_ms))  # type: ignore[no-untyped-call]
    if answer[0] != "ok":
        raise RuntimeError(f"the bench's write was refused: {answer}")


async def _counted_calls(redis: Redis) -> int:
    """The commands Redis ran since its last ``CONFIG RESETSTAT``, less the ones that are not
    the work measured (``_SKIPPED``)."""
    stats: dict[str, Any] = await redis.info("commandstats")
    return sum(
        int(value["calls"])
        for name, value in stats.items()
        if name.removeprefix("cmdstat_").split("|")[0] not in _SKIPPED
    )


async def commands_per_write(redis: Redis, board: Board, extra: dict[str, Any]) -> float:
    """The Redis commands one steady-state write runs on ``board``: every user already has an
    entry in every period; the calls of the first pass over the users are not counted."""
    keys = Keys("cmd")
    at = datetime.now(UTC) - timedelta(seconds=1)
    for i in range(USERS + WRITES):
        if i == USERS:
            await redis.config_resetstat()
        await write(redis, keys, board, event(board, extra, i, at + timedelta(microseconds=i)))
    calls = await _counted_calls(redis)
    await redis.flushall()
    return calls / WRITES


async def commands_per_derived_event(redis: Redis, board: Board, extra: dict[str, Any]) -> float:
    """The Redis commands the derive step runs per event, the writes' events derived in batches
    of ``DERIVE_BATCH`` as the aggregator takes them from the stream."""
    keys = Keys("cmd")
    at = datetime.now(UTC) - timedelta(seconds=1)
    for i in range(WRITES):
        await write(redis, keys, board, event(board, extra, i, at + timedelta(microseconds=i)))
    entries: Any = await redis.xrange(keys.outbox(board.board_id))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    derive = Derive(redis, keys, None, 100)
    await redis.config_resetstat()
    for start in range(0, len(events), DERIVE_BATCH):
        derive_keys, derive_args = derive.call(board, events[start : start + DERIVE_BATCH], "t")
        await redis.fcall(DERIVE_FUNCTION, len(derive_keys), *derive_keys, *derive_args)
    calls = await _counted_calls(redis)
    await redis.flushall()
    return calls / len(events)


async def measure() -> list[Line]:
    if shutil.which("redis-server") is None:
        return [Note("Redis commands per write: no redis-server binary here, not counted.")]
    rows: list[Line] = []
    async with private_redis() as redis:
        for name, (board, extra) in SHAPES.items():
            count = await commands_per_write(redis, board, extra)
            rows.append(Row(f"Redis commands per steady-state write, {name}", f"{count:.1f}"))
        for name, (board, extra) in SHAPES.items():
            count = await commands_per_derived_event(redis, board, extra)
            rows.append(Row(f"Redis commands per event in the derive step, {name}", f"{count:.1f}"))
    return rows


if __name__ == "__main__":
    for line in asyncio.run(measure()):
        print(f"{line.figure}: {line.value}" if isinstance(line, Row) else line.text)
