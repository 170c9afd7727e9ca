"""A user's score writes while its erasure is pending (docs/api.md section 8b): refused with a
503 and nothing written, until the erasure is done; a write after that is a fresh user's, which
the erasure leaves alone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from sqlalchemy import event

from services.api.eraser import Eraser
from services.api.erasing import ErasingUsers
from services.api.errors import Unavailable
from shared.boards import BoardCatalog
from shared.db import open_engine
from shared.erasure import pending_erasures, request_erasure, user_hash
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem, done, post, score
from tests.helpers import ADMIN, SERVER, api_client, eventually


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def test_writes_wait_for_the_erasure_and_a_fresh_user_s_first_events_stay(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, score(user_id="u-9", value=5, event_id="old-1"))
        answer = await client.delete("/v1/users/u-9", headers=ADMIN)
        cutoff = datetime.fromisoformat(answer.json()["cutoff"])
        # Past the cut-off, before the erasure is done (its second pass comes 0.5 s later).
        await asyncio.sleep((cutoff - datetime.now(UTC)).total_seconds() + 0.05)
        refused = await client.post(
            "/v1/boards/main/scores", json=score(user_id="u-9", value=7), headers=SERVER
        )
        assert_problem(refused, 503)
        assert refused.headers["retry-after"] == "2"
        batch = await client.post(
            "/v1/boards/main/scores/batch",
            json={"events": [score(user_id="u-9", event_id="b-1"), score(user_id="u-1")]},
            headers=SERVER,
        )
        first, second = batch.json()["results"]
        assert first["event_id"] == "b-1" and first["error"]["status"] == 503
        assert "error" not in second
        assert not await redis.exists(keys.idempotency("main", "b-1", "u-9"))

        await eventually(lambda: done(client, "/v1/erasures/u-9"), within=15)
        assert not await redis.hexists(keys.erasing, user_hash("u-9", quiet.effective_jwt_secret))
        await asyncio.sleep(0.6)  # the process's read of the pending erasures ages out
        fresh = await post(client, score(user_id="u-9", value=7, event_id="new-1"))
        assert fresh["duplicate"] is False
        standing = await client.get(
            "/v1/boards/main/users/u-9", params={"scope": "region:eu"}, headers=SERVER
        )
        assert standing.status_code == 200 and standing.json()["score"] == 7
        assert await redis.exists(keys.idempotency("main", "new-1", "u-9"))


async def test_the_worker_keeps_the_waiting_users_to_the_pending_erasures(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """An entry Redis lost comes back; one left by a crash after its erasure was done goes, so
    that the user is not refused for ever."""
    secret = quiet.effective_jwt_secret
    async with open_engine(quiet.mysql_url) as engine:
        await request_erasure(engine, redis, keys, "u-1", secret)
        await redis.delete(keys.erasing)
        await redis.hset(keys.erasing, user_hash("u-2", secret), 1)
        eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
        await eraser.round()
        assert [e.user_id for e in await pending_erasures(engine)] == ["u-1"]
        assert await redis.hkeys(keys.erasing) == [user_hash("u-1", secret)]


async def test_an_idle_round_is_one_statement_and_still_takes_a_stale_mark_away(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Every API process polls every half second: with nothing pending, a round reads MySQL
    once and takes no lock. A mark in Redis with no job behind it still has a round take it
    away, and a job recorded after an idle round is worked by the next."""
    secret = quiet.effective_jwt_secret
    async with open_engine(quiet.mysql_url) as engine:
        statements: list[str] = []

        def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
            statements.append(statement)

        event.listen(engine.sync_engine, "before_cursor_execute", seen)
        eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
        assert await eraser.round() == 0
        assert len(statements) == 1 and "GET_LOCK" not in statements[0]
        assert "erasures" in statements[0] and "board_deletions" in statements[0]

        await redis.hset(keys.erasing, user_hash("u-2", secret), 1)
        statements.clear()
        await eraser.round()
        assert not await redis.exists(keys.erasing)
        assert any("GET_LOCK" in s for s in statements)

        await request_erasure(engine, redis, keys, "u-1", secret)
        await redis.delete(keys.erasing)  # as if the request's process stopped before Redis
        await eraser.round()
        assert await redis.hkeys(keys.erasing) == [user_hash("u-1", secret)]


async def test_a_write_just_after_the_erasure_is_done_is_taken(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A process keeps its read of the pending erasures half a second: a user found in it is
    looked up again before its write is refused, so that once its erasure is done (its entry
    gone) the next write is a fresh user's at once, not a 503 for another half second."""
    secret = quiet.effective_jwt_secret
    erasing = ErasingUsers(redis, keys, secret)
    await redis.hset(keys.erasing, mapping={user_hash(u, secret): 1 for u in ("u-1", "u-2")})
    with pytest.raises(Unavailable):
        await erasing.check("u-1")
    assert await erasing.erasing(["u-1", "u-2", "u-3"]) == {"u-1", "u-2"}
    # The worker is done with u-1: its entry goes (services/api/eraser.py), well within the
    # half second the process keeps what it read.
    await redis.hdel(keys.erasing, user_hash("u-1", secret))
    await erasing.check("u-1")
    assert await erasing.erasing(["u-1", "u-2", "u-3"]) == {"u-2"}
    with pytest.raises(Unavailable):
        await erasing.check("u-2")
