"""Idempotency (docs/api.md section 4): a repeated event answers the first result and counts
once."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, SCORES, assert_problem, get_ok, post, rfc, score
from tests.helpers import ADMIN, SERVER, api_client

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


async def test_a_repeated_event_answers_the_first_result_and_counts_once(
    quiet: LadderSettings, redis: Redis
) -> None:
    async with api_client(quiet) as client:
        first = await post(client, score(event_id="evt-1", value=5))
        # Someone overtakes u-1 in between: the repeat still answers the first result.
        await post(client, score(user_id="u-2", value=50))
        again = await post(client, score(event_id="evt-1", value=5))
        board = await get_ok(client, LEADERBOARD, scope="region:eu")
        standing = await get_ok(client, "/v1/boards/main/users/u-1", scope="region:eu")

    assert first["duplicate"] is False
    assert again["duplicate"] is True
    assert again["event_id"] == "evt-1"
    assert again["periods"] == first["periods"]
    assert {k: v for k, v in again.items() if k != "duplicate"} == {
        k: v for k, v in first.items() if k != "duplicate"
    }
    assert [(e["user_id"], e["score"]) for e in board["entries"]] == [("u-2", 50), ("u-1", 5)]
    assert standing["score"] == 5
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 2


async def test_the_idempotency_key_header_is_the_event_id(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        first = await post(client, score(value=7), headers=SERVER | {"Idempotency-Key": "key-1"})
        by_header = await post(
            client, score(value=7), headers=SERVER | {"Idempotency-Key": "key-1"}
        )
        by_body = await post(client, score(event_id="key-1", value=7))
        both = await post(
            client, score(event_id="key-1", value=7), headers=SERVER | {"Idempotency-Key": "key-1"}
        )
        conflict = await client.post(
            SCORES, json=score(value=8), headers=SERVER | {"Idempotency-Key": "key-1"}
        )
        standing = await get_ok(client, "/v1/boards/main/users/u-1", scope="region:eu")

    assert first["event_id"] == "key-1" and first["duplicate"] is False
    for repeat in (by_header, by_body, both):
        assert repeat["duplicate"] is True
        assert repeat["periods"] == first["periods"]
    assert_problem(conflict, 409)
    assert standing["score"] == 7


async def test_without_an_event_id_the_server_makes_one(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        one = await post(client, score(value=2))
        two = await post(client, score(value=3))
        standing = await get_ok(client, "/v1/boards/main/users/u-1", scope="region:eu")

    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", one["event_id"])
    assert one["event_id"] != two["event_id"]
    assert not one["duplicate"] and not two["duplicate"]
    assert standing["score"] == 5


async def test_a_retry_after_the_lateness_window_is_still_a_duplicate(
    quiet: LadderSettings,
) -> None:
    settings = quiet.model_copy(update={"allowed_lateness": 2.0})
    async with api_client(settings) as client:
        # A first write pays for what a process does once (on a cluster, the slot map and the
        # function library), which took the first POST past a tighter allowance on a slow run.
        await post(client, score(event_id="warm-up", user_id="u-warm"))
        occurred = datetime.now(UTC) - timedelta(seconds=0.5)
        body = score(event_id="late-1", occurred_at=rfc(occurred))
        first = await post(client, body)
        # Only the clock can take the event past the allowance: wait out what is left of it.
        left = occurred + timedelta(seconds=2.05) - datetime.now(UTC)
        await asyncio.sleep(max(left.total_seconds(), 0))
        fresh = await client.post(
            SCORES, json=score(event_id="late-2", occurred_at=rfc(occurred)), headers=SERVER
        )
        retry = await post(client, body)

    assert_problem(fresh, 422)
    assert retry["duplicate"] is True
    assert retry["periods"] == first["periods"]


async def test_a_retry_naming_the_same_moment_in_another_offset_is_a_duplicate(
    quiet: LadderSettings,
) -> None:
    """``occurred_at`` is a moment: a retry that writes it with another offset (a client that
    formats times in its local zone, another that formats them in UTC) sends the same body."""
    occurred = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    plus_one = occurred.astimezone(timezone(timedelta(hours=1))).isoformat()
    async with api_client(quiet) as client:
        first = await post(client, score(event_id="zone-1", occurred_at=rfc(occurred)))
        retry = await post(client, score(event_id="zone-1", occurred_at=plus_one))
        later = occurred + timedelta(seconds=1)
        other = await client.post(
            SCORES, json=score(event_id="zone-1", occurred_at=rfc(later)), headers=SERVER
        )

    assert plus_one.endswith("+01:00")
    assert retry["duplicate"] is True
    assert retry["periods"] == first["periods"]
    assert_problem(other, 409)


@pytest.mark.usefixtures("mysql_database")
async def test_a_retry_after_the_board_narrowed_is_still_its_duplicate(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    # The event was accepted; then an admin narrowed the board's values and regions. A retry of
    # it is answered as stored, not judged again against the new definition (422).
    definition = {"operator": "best", "periods": ["alltime"], "max_value": 1000}
    async with api_client(quiet) as client:
        put = await client.put("/v1/boards/narrow", json=definition, headers=ADMIN)
        assert put.status_code == 201, put.text
        body = score(user_id="u-1", region="eu", value=500, event_id="e-1")
        first = await client.post("/v1/boards/narrow/scores", json=body, headers=SERVER)
        assert first.status_code == 200, first.text
        narrowed = definition | {"max_value": 100, "regions": ["na"]}
        put = await client.put("/v1/boards/narrow", json=narrowed, headers=ADMIN)
        assert put.status_code == 200, put.text
        again = await client.post("/v1/boards/narrow/scores", json=body, headers=SERVER)
        assert again.status_code == 200, again.text
        assert again.json()["duplicate"] is True
        assert again.json()["periods"] == first.json()["periods"]
        # A new event is judged by the new definition.
        fresh = score(user_id="u-1", region="eu", value=50, event_id="e-2")
        assert_problem(
            await client.post("/v1/boards/narrow/scores", json=fresh, headers=SERVER), 422
        )
    assert await redis.xlen(keys.outbox("narrow")) == 1
