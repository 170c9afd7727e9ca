"""The events read (docs/api.md section 7): a user's events come from the history database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from services.history.handlers import HistoryHandler
from shared.db import open_engine
from shared.events import ScoreAccepted
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem, get_ok
from tests.helpers import accepted_event, api_client, player

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
        own = await client.get("/v1/boards/main/users/u-1/events", headers=player("u-1"))
        other = await client.get("/v1/boards/main/users/u-2/events", headers=player("u-1"))

    assert empty == {"events": [], "next_cursor": None}
    assert first["events"][0] == {
        "event_id": "e-4",
        "user_id": "u-1",
        "region": "eu",
        "team_id": "red-wombats",
        "value": -6,
        "occurred_at": "2026-11-29T17:00:02.000Z",
        "accepted_at": "2026-11-29T17:00:03.000Z",
    }
    assert [e["event_id"] for e in first["events"]] == ["e-4", "e-3"]
    assert [e["event_id"] for e in second["events"]] == ["e-1"]
    assert second["next_cursor"] is None
    assert own.status_code == 200
    assert [e["event_id"] for e in own.json()["events"]] == ["e-4", "e-3", "e-1"]
    assert_problem(other, 403)
