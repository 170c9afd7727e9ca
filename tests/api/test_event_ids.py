"""An event id belongs to its board and user (docs/api.md section 4; docs/security.md, "Event-id
squatting"): the same id for another user is another event, on the write (single, with the
``Idempotency-Key`` header, late retries, batches), in every consumer and in the event log;
the same id for the same user is still its duplicate, or 409 with another body."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.boards import Board
from shared.db import count_events, open_engine
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import SCORES, get_ok, post, rfc, score
from tests.api.test_event_record import (
    AGGREGATOR_BIT,
    NOTIFIER_BIT,
    PENDING_BIT,
    consume,
    outbox,
)
from tests.helpers import ADMIN, SERVER, api_client, eventually, player
from tests.stack import Stack

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

BATCH = "/v1/boards/main/scores/batch"
# A predictable id of the game server's, for its match 7 and player u-42.
SQUATTED = "match-7-u-42"
# A board that takes player writes; where boards declare their regions (which such a board must
# do), it declares the one these tests use.
PLAYER_BOARD: dict[str, Any] = {"player_writes": True} | (
    {"regions": ["eu"]} if "regions" in Board.model_fields else {}
)


def without_duplicate(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "duplicate"}


@pytest.mark.stack
async def test_a_players_event_id_does_not_block_another_users_event(stack: Stack) -> None:
    """The squatting attack: a player posts the game server's predictable id first, for
    itself. The game server's real score for another user is then accepted (not 409), and both
    events reach the history database, each read back as its own user's."""
    scores = "/v1/boards/open/scores"
    async with httpx.AsyncClient(base_url=stack.api, timeout=10) as api:
        made = await api.put("/v1/boards/open", json=PLAYER_BOARD, headers=ADMIN)
        assert made.status_code == 201, made.text
        squat_body = score(event_id=SQUATTED, user_id="mallory", value=1)
        squat = await post(api, squat_body, headers=player("mallory"), board="open")
        real_body = score(event_id=SQUATTED, user_id="u-42", value=50)
        real = await api.post(scores, json=real_body, headers=SERVER)
        assert real.status_code == 200, real.text
        # Each one's retry is its own duplicate; the player's other body is still a conflict.
        real_again = await post(api, real_body, board="open")
        squat_again = await post(api, squat_body, headers=player("mallory"), board="open")
        other_body = await api.post(
            scores, json=squat_body | {"value": 2}, headers=player("mallory")
        )
        # The Idempotency-Key header is the same id: for a third user, a third event.
        by_header = await api.post(
            scores,
            json=score(user_id="u-43", value=7),
            headers=SERVER | {"Idempotency-Key": SQUATTED},
        )
        assert by_header.status_code == 200, by_header.text

        async with open_engine(stack.settings.mysql_url) as engine:

            async def all_stored() -> bool:
                return await count_events(engine, "open", SQUATTED) == 3

            await eventually(all_stored, within=30)
            per_user = {
                user: await count_events(engine, "open", SQUATTED, user)
                for user in ("mallory", "u-42", "u-43")
            }
        history = {
            user: (await get_ok(api, f"/v1/boards/open/users/{user}/events"))["events"]
            for user in ("mallory", "u-42", "u-43")
        }
        board = await get_ok(api, "/v1/boards/open/leaderboard", scope="region:eu")

        async def fed() -> list[Any] | None:
            events = (await get_ok(api, "/v1/boards/open/feed"))["events"]
            return events if len(events) == 3 else None

        feed = await eventually(fed, within=30)

    assert squat["duplicate"] is False
    assert real.json()["duplicate"] is False and real.json()["user_id"] == "u-42"
    assert real.json()["periods"]["alltime"]["score"] == 50
    assert by_header.json()["duplicate"] is False and by_header.json()["event_id"] == SQUATTED
    assert real_again["duplicate"] is True
    assert without_duplicate(real_again) == without_duplicate(real.json())
    assert squat_again["duplicate"] is True and squat_again["user_id"] == "mallory"
    assert other_body.status_code == 409
    assert per_user == {"mallory": 1, "u-42": 1, "u-43": 1}
    assert {u: [(e["event_id"], e["value"]) for e in h] for u, h in history.items()} == {
        "mallory": [(SQUATTED, 1)],
        "u-42": [(SQUATTED, 50)],
        "u-43": [(SQUATTED, 7)],
    }
    assert [(e["user_id"], e["score"]) for e in board["entries"]] == [
        ("u-42", 50),
        ("u-43", 7),
        ("mallory", 1),
    ]
    assert sorted((e["event_id"], e["user_id"]) for e in feed) == [
        (SQUATTED, "mallory"),
        (SQUATTED, "u-42"),
        (SQUATTED, "u-43"),
    ]


async def test_a_batch_tells_users_apart_and_repeats_within_it(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """One batch: an id for two users is two events; the same id, user and body again within the
    batch is the first one's duplicate, and with another body 409, for that event alone."""
    events = [
        score(event_id="b-1", user_id="u-1", value=5),
        score(event_id="b-1", user_id="u-2", value=5),
        score(event_id="b-1", user_id="u-1", value=5),
        score(event_id="b-1", user_id="u-1", value=6),
        score(event_id="b-1", user_id="u-2", value=5),
        score(event_id="b-2", user_id="u-2", value=3),
    ]
    async with api_client(quiet) as client:
        answer = await client.post(BATCH, json={"events": events}, headers=SERVER)
        assert answer.status_code == 200, answer.text
        board = await get_ok(client, "/v1/boards/main/leaderboard", scope="region:eu")
    results = answer.json()["results"]
    assert [r.get("duplicate", r.get("error", {}).get("status")) for r in results] == [
        False,
        False,
        True,
        409,
        True,
        False,
    ]
    assert [r["user_id"] for i, r in enumerate(results) if i != 3] == ["u-1", "u-2"] * 2 + ["u-2"]
    assert without_duplicate(results[2]) == without_duplicate(results[0])
    assert without_duplicate(results[4]) == without_duplicate(results[1])
    assert [(e["user_id"], e["score"]) for e in board["entries"]] == [("u-2", 8), ("u-1", 5)]
    assert len(await outbox(redis, keys)) == 3
    assert (
        await redis.exists(
            keys.idempotency("main", "b-1", "u-1"), keys.idempotency("main", "b-1", "u-2")
        )
        == 2
    )


async def test_a_repeat_within_a_batch_with_an_invalid_body_is_409(quiet: LadderSettings) -> None:
    """The batch validates every event before it writes any: a repeat of an accepted event's id
    with another body is 409 even where that body would fail validation (a value past the
    board's range, a field of the wrong type), as it is once the first is stored; a repeat of a
    refused event is judged on its own."""
    events = [
        score(event_id="v-1", user_id="u-1", value=5),
        score(event_id="v-1", user_id="u-1", value=5_000_000),
        score(event_id="v-1", user_id="u-1", value="five"),
        score(event_id="v-1", user_id="u-2", value=5_000_000),
        score(event_id="v-2", user_id="u-1", value=5_000_000),
        score(event_id="v-2", user_id="u-1", value=6_000_000),
    ]
    async with api_client(quiet) as client:
        answer = await client.post(BATCH, json={"events": events}, headers=SERVER)
        assert answer.status_code == 200, answer.text
        stored = await client.post(SCORES, json=events[1], headers=SERVER)
    results = answer.json()["results"]
    assert [r.get("duplicate", r.get("error", {}).get("status")) for r in results] == [
        False,
        409,
        409,
        422,
        422,
        422,
    ]
    assert stored.status_code == 409


async def test_a_late_retry_is_answered_from_its_own_users_record(quiet: LadderSettings) -> None:
    """Past the allowed lateness a retry is still its event's duplicate: read from the record of
    its own user, not from another user's event of that id, which answers a third user's late
    event no more than it would a timely one."""
    settings = quiet.model_copy(update={"allowed_lateness": 1.0})
    occurred = rfc(datetime.now(UTC))
    first = score(event_id="late-1", user_id="u-1", value=5, occurred_at=occurred)
    second = score(event_id="late-1", user_id="u-2", value=9, occurred_at=occurred)
    async with api_client(settings) as client:
        await post(client, first)
        answered = await post(client, second)
        await asyncio.sleep(1.5)
        again = await post(client, second)
        other = await client.post(SCORES, json=second | {"value": 10}, headers=SERVER)
        third = await client.post(SCORES, json=second | {"user_id": "u-3"}, headers=SERVER)
    assert answered["duplicate"] is False
    assert again == answered | {"duplicate": True}
    assert again["periods"]["alltime"]["score"] == 9
    assert other.status_code == 409
    assert third.status_code == 422, third.text
    assert third.json()["errors"][0]["loc"] == ["body", "occurred_at"]


async def test_every_consumer_counts_each_users_event_of_one_id_once(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Two users' events of one id, handed to the aggregator's and the notifier's handlers in
    one batch and then redelivered: each is derived (feed, counts, team sums), contributed, in
    the hot view and marked by both consumers, exactly once."""
    occurred = rfc(datetime.now(UTC) - timedelta(milliseconds=100))
    async with api_client(quiet) as client:
        for user, value in (("u-1", 10), ("u-2", 20)):
            await post(
                client,
                score(
                    event_id="c-1", user_id=user, value=value, team_id="red", occurred_at=occurred
                ),
            )
    events = await outbox(redis, keys)
    assert [(e.event_id, e.user_id) for e in events] == [("c-1", "u-1"), ("c-1", "u-2")]
    await consume(redis, keys, events)
    await consume(redis, keys, events + events)
    records = [keys.idempotency("main", "c-1", user) for user in ("u-1", "u-2")]
    for record in records:
        assert await redis.getbit(record, NOTIFIER_BIT) == 1
        assert await redis.getbit(record, AGGREGATOR_BIT) == 1
        assert await redis.getbit(record, PENDING_BIT) == 0
    feed = await redis.lrange(keys.feed("main"), 0, -1)
    assert len(feed) == 2
    assert await redis.get(keys.event_count("main", "alltime", "all")) == "2"
    members = keys.team_members("main", "alltime", "all", "red")
    assert await redis.zrange(members, 0, -1, withscores=True) == [("u-1", 10.0), ("u-2", 20.0)]
    assert await redis.zcard(keys.hot_events("main")) == 2
