"""The group commit of single score writes (services/api/write/group.py): concurrent POSTs share
round trips, and each write stays its own (answer, idempotency, limits, refusal, failure)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError

from services.api.auth import authenticate
from services.api.errors import Problem
from services.api.write import limits
from services.api.write.group import GroupCommit, group_commit
from services.api.write.models import ScoreIn
from services.api.write.submit import FAILED, Call, answer, prepare
from shared.boards import Board
from shared.keys import Keys
from shared.redis_cluster import LadderClusterPipeline
from shared.settings import DEV_SERVER_KEY, LadderSettings
from tests.api.helpers import LEADERBOARD, SCORES, assert_problem, get_ok, score
from tests.helpers import SERVER, api_client

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


async def forget(redis: Redis, prefix: str) -> None:
    """Remove the keys of a prefix the fixtures do not know (a test's second Ladder)."""
    for pattern in (f"{prefix}:*", "{" + prefix + ":*"):
        found = [key async for key in redis.scan_iter(match=pattern, count=1000)]
        if found:
            await redis.delete(*found)


def sent() -> tuple[float, float]:
    """Groups sent and the writes in them so far, in this process."""
    groups = REGISTRY.get_sample_value("ladder_api_write_groups_total") or 0.0
    writes = REGISTRY.get_sample_value("ladder_api_write_grouped_total") or 0.0
    return groups, writes


class Writer:
    """Prepared writes of board main under the development server key's quota."""

    def __init__(self, redis: Redis, settings: LadderSettings) -> None:
        self.redis, self.settings = redis, settings
        self.keys = Keys(settings.key_prefix)
        self.board = Board(board_id="main")
        principal = authenticate(DEV_SERVER_KEY, settings)
        self.quota = limits.quota(self.keys, settings, "main", principal, DEV_SERVER_KEY)

    async def call(self, event_id: str, **fields: Any) -> Call:
        body = ScoreIn.model_validate(score(**fields))
        now = datetime.now(UTC)
        return await prepare(self.redis, self.keys, self.settings, self.board, body, event_id, now)

    def command(self, call: Call) -> list[Any]:
        return call.command(self.quota, int(time.time() * 1000))


async def outcome(call: Call, future: asyncio.Future[tuple[str, str]]) -> Any:
    """What the client would get: the answer, or the problem's status."""
    try:
        return answer(*await future, call)
    except Problem as problem:
        return problem.status


async def test_concurrent_posts_share_round_trips_and_end_as_sequential_ones(
    quiet: LadderSettings, redis: Redis
) -> None:
    # Twelve users, four events each, in two regions: any order gives the same sums.
    bodies = [
        score(event_id=f"e-{u}-{i}", user_id=f"u-{u}", region="eu" if u % 2 else "us", value=u + i)
        for u in range(12)
        for i in range(4)
    ]
    standings = {}
    for mode in ("concurrent", "sequential"):
        settings = quiet.model_copy(update={"key_prefix": f"{quiet.key_prefix}-{mode[0]}"})
        before = sent()
        async with api_client(settings) as client:
            if mode == "concurrent":
                answers = await asyncio.gather(
                    *(client.post(SCORES, json=body, headers=SERVER) for body in bodies)
                )
            else:
                answers = [await client.post(SCORES, json=body, headers=SERVER) for body in bodies]
            assert [a.status_code for a in answers] == [200] * len(bodies)
            assert {a.json()["event_id"] for a in answers} == {b["event_id"] for b in bodies}
            standings[mode] = [
                await get_ok(client, LEADERBOARD, scope=f"region:{region}", period="alltime")
                for region in ("eu", "us")
            ]
        groups, writes = (now - then for now, then in zip(sent(), before, strict=True))
        assert writes == len(bodies)
        if mode == "concurrent":
            assert groups < writes / 4, (groups, writes)
        else:
            assert groups == writes
        assert await redis.xlen(Keys(settings.key_prefix).outbox("main")) == len(bodies)
        await forget(redis, settings.key_prefix)
    concurrent, sequential = (
        [[(e["user_id"], e["score"], e["rank"]) for e in board["entries"]] for board in boards]
        for boards in (standings["concurrent"], standings["sequential"])
    )
    assert concurrent == sequential
    assert sum(len(entries) for entries in concurrent) == 12


async def test_duplicates_and_a_conflict_in_one_group(
    settings: LadderSettings, redis: Redis
) -> None:
    writer = Writer(redis, settings)
    same = [await writer.call("evt-1", value=5) for _ in range(4)]
    other_body = await writer.call("evt-1", value=6)
    calls = [*same, other_body]
    writes = GroupCommit(redis, window=0.001, most=100)
    before = sent()
    futures = [writes.write(writer.command(call)) for call in calls]
    outcomes = [await outcome(call, future) for call, future in zip(calls, futures, strict=True)]
    assert sent()[0] - before[0] == 1
    first, *again = outcomes[:4]
    assert first["duplicate"] is False
    for repeat in again:
        assert repeat["duplicate"] is True
        assert repeat["periods"] == first["periods"]
    assert outcomes[4] == 409
    assert await redis.xlen(writer.keys.outbox("main")) == 1


async def test_a_rate_limit_refusal_in_a_group_refuses_that_write_alone(
    settings: LadderSettings, redis: Redis
) -> None:
    # A user may burst to twice its rate: two of ana's five writes pass, bob's passes.
    writer = Writer(redis, settings.model_copy(update={"user_rate": 1.0}))
    calls = [await writer.call(f"a-{i}", user_id="ana", value=1) for i in range(5)]
    calls.append(await writer.call("b-0", user_id="bob", value=1))
    writes = GroupCommit(redis, window=0.001, most=100)
    futures = [writes.write(writer.command(call)) for call in calls]
    outcomes = [await outcome(call, future) for call, future in zip(calls, futures, strict=True)]
    assert [o if isinstance(o, int) else o["user_id"] for o in outcomes] == [
        "ana",
        "ana",
        429,
        429,
        429,
        "bob",
    ]
    assert await redis.xlen(writer.keys.outbox("main")) == 3


async def test_an_error_of_one_call_fails_that_call_only(
    settings: LadderSettings, redis: Redis
) -> None:
    writer = Writer(redis, settings)
    good = [await writer.call(f"g-{i}", user_id=f"u-{i}") for i in range(3)]
    writes = GroupCommit(redis, window=0.001, most=100)
    futures = [writes.write(writer.command(call)) for call in good[:2]]
    broken = writes.write(["ladder_no_such_function_v0", 0])
    futures.append(writes.write(writer.command(good[2])))
    # That call's own answer: a failure, which the client gets as a 503 problem, not a 500.
    status, reply = await broken
    assert status == FAILED and "function" in reply.lower(), (status, reply)
    assert await outcome(good[0], broken) == 503
    assert [(await outcome(c, f))["user_id"] for c, f in zip(good, futures, strict=True)] == [
        "u-0",
        "u-1",
        "u-2",
    ]


@contextlib.asynccontextmanager
async def hanging_up_server() -> AsyncIterator[int]:
    """A port whose server reads what it is sent and hangs up without an answer: Redis gone in
    the middle of a round trip."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def test_redis_lost_mid_group_fails_every_waiting_write(
    settings: LadderSettings, redis: Redis
) -> None:
    writer = Writer(redis, settings)
    calls = [await writer.call(f"e-{i}", user_id=f"u-{i}") for i in range(5)]
    async with hanging_up_server() as port:
        gone = Redis.from_url(f"redis://127.0.0.1:{port}/0", decode_responses=True)
        writes = GroupCommit(gone, window=0.001, most=100)
        futures = [writes.write(writer.command(call)) for call in calls]
        results = await asyncio.gather(*futures, return_exceptions=True)
        await gone.aclose()
    assert all(isinstance(r, RedisConnectionError) for r in results), results
    # Each request gets its own exception (a shared one would gather every traceback).
    assert len({id(r) for r in results}) == len(results)


async def test_redis_down_answers_503_to_every_waiting_post(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with api_client(quiet) as client:

        async def down(self: Pipeline, raise_on_error: bool = True) -> list[Any]:
            raise RedisConnectionError("Connection refused")

        with monkeypatch.context() as patch:
            # The pipeline of one Redis, or of a cluster (shared/redis_cluster.py).
            patch.setattr(
                LadderClusterPipeline if quiet.redis_cluster else Pipeline, "execute", down
            )
            answers = await asyncio.gather(
                *(
                    client.post(SCORES, json=score(user_id=f"u-{i}"), headers=SERVER)
                    for i in range(8)
                )
            )
        for response in answers:
            assert_problem(response, 503)
        # Back up: the next writes go through.
        assert (await client.post(SCORES, json=score(), headers=SERVER)).status_code == 200


async def test_a_lone_write_does_not_wait_the_window(
    settings: LadderSettings, redis: Redis
) -> None:
    writer = Writer(redis, settings)
    first, second = [await writer.call(f"e-{i}", user_id=f"u-{i}") for i in range(2)]
    writes = GroupCommit(redis, window=30.0, most=100)
    started = time.monotonic()
    assert (await outcome(first, writes.write(writer.command(first))))["user_id"] == "u-0"
    # One written while another is in flight goes when that one returns, not after the window.
    in_flight = writes.write(writer.command(first))
    await asyncio.sleep(0)
    behind = writes.write(writer.command(second))
    assert (await outcome(second, behind))["user_id"] == "u-1"
    assert (await outcome(first, in_flight))["duplicate"] is True
    assert time.monotonic() - started < 5.0


async def test_drain_sends_what_waits_and_a_cancelled_write_writes_nothing(
    settings: LadderSettings, redis: Redis
) -> None:
    writer = Writer(redis, settings)
    calls = [await writer.call(f"e-{i}", user_id=f"u-{i}") for i in range(4)]
    writes = GroupCommit(redis, window=30.0, most=100)
    first = writes.write(writer.command(calls[0]))
    await asyncio.sleep(0)  # the first group is out; the next ones wait behind it
    waiting = [writes.write(writer.command(call)) for call in calls[1:]]
    waiting[-1].cancel()  # its request went away before its group left
    await writes.drain()
    assert all(future.done() for future in [first, *waiting])
    sent_ones = zip(calls[:3], [first, *waiting[:2]], strict=True)
    assert [(await outcome(c, f))["user_id"] for c, f in sent_ones] == ["u-0", "u-1", "u-2"]
    assert await redis.exists(writer.keys.idempotency("main", "e-3", "u-3")) == 0
    # After the drain each write goes alone, at once.
    late = await writer.call("e-late", user_id="u-late")
    assert (await outcome(late, writes.write(writer.command(late))))["user_id"] == "u-late"
    assert await redis.xlen(writer.keys.outbox("main")) == 4


async def test_the_lifespan_context_drains_on_the_way_out(
    settings: LadderSettings, redis: Redis
) -> None:
    writer = Writer(redis, settings)
    calls = [await writer.call(f"e-{i}", user_id=f"u-{i}") for i in range(6)]
    async with group_commit(redis, window=30.0, most=100) as writes:
        first = writes.write(writer.command(calls[0]))
        await asyncio.sleep(0)
        behind = [writes.write(writer.command(call)) for call in calls[1:]]
    assert all(future.done() for future in [first, *behind])
    assert await redis.xlen(writer.keys.outbox("main")) == 6


async def test_group_commit_off_sends_each_write_alone(quiet: LadderSettings, redis: Redis) -> None:
    settings = quiet.model_copy(update={"write_group_ms": 0.0})
    before = sent()
    async with api_client(settings) as client:
        answers = await asyncio.gather(
            *(client.post(SCORES, json=score(user_id=f"u-{i}"), headers=SERVER) for i in range(6))
        )
        assert [a.status_code for a in answers] == [200] * 6
        assert await redis.xlen(Keys(settings.key_prefix).outbox("main")) == 6
    groups, writes = (now - then for now, then in zip(sent(), before, strict=True))
    assert groups == writes == 6
