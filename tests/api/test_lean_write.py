"""The write's two layouts of keys (shared/lua/write.lua, shared/submit.py): the API sends the lean
call, which names only the keys the write touches; while the board is being rebuilt that call
writes nothing and answers ``rebuilding``, and every write path sends the journaled call instead,
which the journal keeps whole for the rebuild's replay."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from services.api.errors import Unavailable
from services.api.write.durable import Durability
from services.api.write.limits import Quota
from services.api.write.models import ScoreIn
from services.api.write.submit import (
    FAILED,
    REBUILDING,
    _pipelined,
    answer,
    prepare,
    submit,
    submit_many,
)
from shared.boards import MAIN_BOARD, Board
from shared.functions import JOURNALED_SUBMIT_FUNCTION
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.submit import KEYS_BEFORE, KEYS_PER_PERIOD
from tests.helpers import SERVER, UNREACHABLE_BROKER, api_client

BOARD = Board(board_id="lean", periods=["daily", "weekly", "monthly", "alltime"])
PERIODS = len(BOARD.periods)


def score(value: int, user: str = "u-1", region: str = "eu") -> ScoreIn:
    return ScoreIn(user_id=user, region=region, value=value)


def quota(keys: Keys, board_id: str = BOARD.board_id) -> Quota:
    return Quota(keys, board_id, "key:test", 100.0, 1000.0)


async def rebuilding(redis: Redis, keys: Keys, board_id: str) -> None:
    """The board's flag raised and its journal started, as a rebuild's begin does."""
    await redis.set(keys.rebuilding(board_id), "token")
    await redis.rpush(keys.rebuild_journal(board_id), "begin")


async def journaled(redis: Redis, keys: Keys, board_id: str) -> list[dict[str, list[str]]]:
    return [json.loads(raw) for raw in await redis.lrange(keys.rebuild_journal(board_id), 1, -1)]


async def test_the_lean_call_names_only_the_keys_the_write_touches(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    call = await prepare(redis, keys, settings, BOARD, score(5), "e-1", datetime.now(UTC))
    assert call.journaled_keys is not None
    full = call.journaled_keys()

    # Record, record of the layout before, outbox, flag, newest event, names; three a period
    # (regional board, its records, the regions set); the hidden users: each one of the
    # journaled call's, in the same order.
    assert len(call.keys) == 6 + 3 * PERIODS + 1
    assert len(full) == KEYS_BEFORE + KEYS_PER_PERIOD * PERIODS + 1
    assert [key for key in full if key in call.keys] == call.keys
    assert call.command(None, 0, journaled=True)[:2] == [JOURNALED_SUBMIT_FUNCTION, len(full)]


async def test_during_a_rebuild_the_lean_call_writes_nothing(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    await rebuilding(redis, keys, BOARD.board_id)
    call = await prepare(redis, keys, settings, BOARD, score(5), "e-1", datetime.now(UTC))
    before = set(await redis.keys(f"{keys.tag(BOARD.board_id)}*"))

    status, payload = await redis.execute_command("FCALL", *call.command(quota(keys), 1))

    assert (status, payload) == (REBUILDING, "")
    # No record, outbox entry, board entry, nor token taken: not a key more.
    assert set(await redis.keys(f"{keys.tag(BOARD.board_id)}*")) == before


async def test_every_write_path_sends_the_journaled_call_during_a_rebuild(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    await rebuilding(redis, keys, BOARD.board_id)
    now = datetime.now(UTC)

    alone = await submit(redis, keys, settings, BOARD, score(5), "e-1", quota(keys))
    calls = [
        await prepare(redis, keys, settings, BOARD, score(7, f"u-{n}"), f"e-b{n}", now)
        for n in range(3)
    ]
    batch = await submit_many(redis, calls, quota(keys))

    assert alone["periods"]["alltime"]["score"] == 5
    assert [status for status, _ in batch] == ["ok"] * 3
    entries = await journaled(redis, keys, BOARD.board_id)
    assert [entry["args"][3] for entry in entries] == ["u-1", "u-0", "u-1", "u-2"]
    journaled_keys = KEYS_BEFORE + KEYS_PER_PERIOD * PERIODS + 1
    assert {len(entry["keys"]) for entry in entries} == {journaled_keys}
    assert await redis.xlen(keys.outbox(BOARD.board_id)) == 4
    # A retry is a duplicate, answered without going to the journal again.
    again = await submit(redis, keys, settings, BOARD, score(5), "e-1", quota(keys))
    assert again["duplicate"] is True
    assert len(await journaled(redis, keys, BOARD.board_id)) == 4


@pytest.mark.usefixtures("mysql_database", "broker")
async def test_the_api_journals_single_and_batch_posts_during_a_rebuild(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    quiet = settings.model_copy(
        update={"amqp_url": UNREACHABLE_BROKER, "shutdown_grace_seconds": 1.0}
    )
    board = MAIN_BOARD.board_id
    async with api_client(quiet) as client:
        await rebuilding(redis, keys, board)
        single = await client.post(
            f"/v1/boards/{board}/scores",
            json={"event_id": "p-1", "user_id": "u-1", "region": "eu", "value": 3},
            headers=SERVER,
        )
        events = [
            {"event_id": f"p-{n}", "user_id": f"u-{n}", "region": "na", "value": n}
            for n in range(2, 5)
        ]
        batch = await client.post(
            f"/v1/boards/{board}/scores/batch", json={"events": events}, headers=SERVER
        )

    assert single.status_code == 200, single.text
    assert single.json()["duplicate"] is False
    assert batch.status_code == 200, batch.text
    assert all("error" not in result for result in batch.json()["results"])
    entries = await journaled(redis, keys, board)
    assert [json.loads(entry["args"][6] + "}")["event_id"] for entry in entries] == [
        "p-1",
        "p-2",
        "p-3",
        "p-4",
    ]


async def test_a_write_that_fails_in_redis_fails_alone_in_its_round_trip(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    # Writes of a batch share a pipeline: a script error of one (it was raised for the whole
    # batch, the others written but unanswered) is that write's own 503.
    now = datetime.now(UTC)
    call = await prepare(
        redis, keys, settings, BOARD, ScoreIn(user_id="u", region="eu", value=3), "e-1", now
    )
    broken = ["ladder_no_such_function", 0]
    out = await _pipelined(redis, [call.command(None, 0), broken], Durability(0, 1))
    assert out[0][0] == "ok" and out[1][0] == FAILED
    assert answer(*out[0], call)["periods"]["alltime"]["score"] == 3
    with pytest.raises(Unavailable):
        answer(*out[1], call)
