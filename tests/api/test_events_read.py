"""The events read (docs/api.md section 7): a user's events come from the history database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from redis.asyncio import Redis

from services.history.handlers import HistoryHandler
from shared.boards import MAIN_BOARD, Board
from shared.db import open_engine
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.submit import SubmitEvent, submit_call
from tests.api.helpers import add_board, assert_problem, get_ok
from tests.helpers import SERVER, accepted_event, api_client, player

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


def accepted(event_id: str, user_id: str, value: int, at: datetime) -> ScoreAccepted:
    return accepted_event(event_id, user_id=user_id, value=value, accepted_at=at, display_name=None)


async def test_a_users_events_come_from_the_history_database(
    quiet: LadderSettings, redis: Redis, mysql_database: str
) -> None:
    t0 = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
    async with api_client(quiet) as client:
        empty = await get_ok(client, "/v1/boards/main/users/u-1/events")
        async with open_engine(quiet.mysql_url) as engine:
            await HistoryHandler(engine)(
                [
                    accepted("e-1", "u-1", 3, t0),
                    accepted("e-2", "u-2", 4, t0 + timedelta(seconds=1)),
                    accepted("e-3", "u-1", 5, t0 + timedelta(seconds=2)),
                    accepted("e-4", "u-1", -6, t0 + timedelta(seconds=3)),
                ]
            )
        first = await get_ok(client, "/v1/boards/main/users/u-1/events", limit=2)
        second = await get_ok(
            client, "/v1/boards/main/users/u-1/events", limit=2, cursor=first["next_cursor"]
        )
        # A cursor belongs to the user and board it paged: u-2's page after it skipped u-2's
        # events newer than u-1's last one.
        elsewhere = await client.get(
            "/v1/boards/main/users/u-2/events",
            params={"cursor": first["next_cursor"]},
            headers=SERVER,
        )
        own = await client.get("/v1/boards/main/users/u-1/events", headers=player("u-1"))
        other = await client.get("/v1/boards/main/users/u-2/events", headers=player("u-1"))

    assert empty == {"events": [], "next_cursor": None}
    assert first["events"][0] == {
        "event_id": "e-4",
        "user_id": "u-1",
        "region": "eu",
        "team_id": "red-wombats",
        "value": -6,
        "subscore": None,
        "metadata": None,
        "occurred_at": "2026-11-29T17:00:02.000Z",
        "accepted_at": "2026-11-29T17:00:03.000Z",
    }
    assert [e["event_id"] for e in first["events"]] == ["e-4", "e-3"]
    assert [e["event_id"] for e in second["events"]] == ["e-1"]
    assert second["next_cursor"] is None
    refused = assert_problem(elsewhere, 422)
    assert refused["errors"][0]["msg"] == "cursor was handed out for another board or user"
    assert own.status_code == 200
    assert [e["event_id"] for e in own.json()["events"]] == ["e-4", "e-3", "e-1"]
    assert_problem(other, 403)


# --- subscore and metadata (the contract's v1.1) -------------------------------------------

T1 = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
RACE = Board(board_id="race", operator="best", order="asc", subscore_order="desc")
METADATA = {"car": "ü-7", "laps": [61.5, 60.25], "pit": None}


async def test_the_events_read_carries_subscore_and_metadata(
    quiet: LadderSettings, mysql_database: str
) -> None:
    events = [
        accepted("e-1", "u-1", 61, T1).model_copy(update={"subscore": -3, "metadata": METADATA}),
        accepted("e-2", "u-1", 60, T1 + timedelta(seconds=1)).model_copy(update={"subscore": 0}),
    ]
    async with api_client(quiet) as client:
        async with open_engine(quiet.mysql_url) as engine:
            await HistoryHandler(engine)(events)
        response = await client.get("/v1/boards/main/users/u-1/events", headers=SERVER)

    assert response.status_code == 200, response.text
    got = response.json()["events"]
    assert [(e["event_id"], e["subscore"], e["metadata"]) for e in got] == [
        ("e-2", 0, None),
        ("e-1", -3, METADATA),
    ]
    # The object as it was sent, key order included.
    assert response.content.find(orjson.dumps(METADATA)) > 0


async def test_the_feed_carries_subscore_and_metadata_as_the_events_read_does(
    quiet: LadderSettings, redis: Redis, keys: Keys, mysql_database: str
) -> None:
    """Feed entries are the write's records (shared/submit.py), which name ``subscore`` and
    ``metadata`` only where the event had them; the feed answers both keys always."""
    plain = SubmitEvent("e-1", "u-1", "eu", "red", "Ana", 5, T1, T1)
    wide = SubmitEvent(
        "e-2",
        "u-2",
        "eu",
        None,
        None,
        61,
        T1,
        T1,
        subscore=-3,
        metadata=orjson.dumps(METADATA).decode(),
    )
    async with api_client(quiet) as client:
        await add_board(redis, keys, RACE)
        for board, event in ((MAIN_BOARD, plain), (RACE, wide)):
            _, args = submit_call(
                keys, board, event, body_hash="", idempotency_ttl=60, outbox_max=1, feed_length=10
            )
            # The write function closes the record after the periods' results (write.lua).
            await redis.lpush(keys.feed(board.board_id), f'{args[6]},"periods":{{}}}}')
        main = await get_ok(client, "/v1/boards/main/feed")
        race = await get_ok(client, "/v1/boards/race/feed")

    assert main["events"] == [
        {
            "event_id": "e-1",
            "user_id": "u-1",
            "region": "eu",
            "team_id": "red",
            "value": 5,
            "subscore": None,
            "metadata": None,
            "occurred_at": "2026-11-29T17:00:00.000Z",
            "accepted_at": "2026-11-29T17:00:00.000Z",
        }
    ]
    assert [(e["event_id"], e["subscore"], e["metadata"]) for e in race["events"]] == [
        ("e-2", -3, METADATA)
    ]
    assert list(race["events"][0]) == list(main["events"][0])
