"""A late event whose period is past its retention (docs/api.md section 4): the lateness a
deployment allows may outlast a short season's retention. That period is left out of the write,
which counts in the others; with none left the event is a 422 and nothing is written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.helpers import ADMIN, SERVER, api_client, snapshot

# Minute seasons kept 12 of them: a season's keys go 12 minutes after it ends.
SHORT_SEASONS = {"schedule": "* * * * *", "regions": ["eu"], "retention": {"season": 12}}


@pytest.fixture
def late(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """Events accepted up to 20 minutes late, longer than a minute season is kept."""
    return quiet.model_copy(update={"allowed_lateness": 1200.0})


def event(event_id: str, minutes_ago: int, value: int = 5) -> dict[str, object]:
    at = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    return {
        "event_id": event_id,
        "user_id": "u-1",
        "region": "eu",
        "value": value,
        "occurred_at": at.isoformat(),
    }


async def test_a_late_event_counts_in_its_periods_still_kept_and_leaves_out_the_expired_one(
    quiet: LadderSettings, late: LadderSettings, redis: Redis
) -> None:
    async with api_client(quiet) as client:
        made = await client.put("/v1/boards/cup", json=SHORT_SEASONS, headers=ADMIN)
        assert made.status_code == 201, made.text
    async with api_client(late) as client:
        body = event("e-1", 16)
        first = await client.post("/v1/boards/cup/scores", json=body, headers=SERVER)
        again = await client.post("/v1/boards/cup/scores", json=body, headers=SERVER)
        page = await client.get(
            "/v1/boards/cup/leaderboard", params={"scope": "region:eu", "period": "alltime"}
        )

    assert first.status_code == 200, first.text
    assert "season" not in first.json()["periods"]
    assert first.json()["periods"]["alltime"]["score"] == 5
    # The retry is the same event, counted once.
    assert again.status_code == 200, again.text
    assert again.json()["duplicate"] is True
    assert again.json()["periods"] == first.json()["periods"]
    assert [(e["user_id"], e["score"]) for e in page.json()["entries"]] == [("u-1", 5)]


async def test_a_late_event_whose_every_period_is_past_its_retention_is_refused_whole(
    quiet: LadderSettings, late: LadderSettings, redis: Redis
) -> None:
    keys = Keys(quiet.key_prefix)
    async with api_client(quiet) as client:
        only_seasons = SHORT_SEASONS | {"periods": ["season"]}
        made = await client.put("/v1/boards/cup", json=only_seasons, headers=ADMIN)
        assert made.status_code == 201, made.text
    async with api_client(late) as client:
        before = await snapshot(redis, quiet.key_prefix)
        refused = await client.post("/v1/boards/cup/scores", json=event("e-1", 16), headers=SERVER)
        after = await snapshot(redis, quiet.key_prefix)
        kept = await client.post("/v1/boards/cup/scores", json=event("e-2", 1), headers=SERVER)

    problem = assert_problem(refused, 422)
    assert "retention" in problem["detail"], problem
    assert after == before
    # An event of a season still kept is written as before.
    assert kept.status_code == 200, kept.text
    assert await redis.xlen(keys.outbox("cup")) == 1
