"""``period_ends_at`` on leaderboard reads: the end of the read's window, null for alltime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from shared.settings import LadderSettings
from tests.helpers import ADMIN, api_client


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database."""
    return quiet


def _utc(text: str) -> datetime:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_period_ends_at_is_the_windows_end(quiet: LadderSettings) -> None:
    # Asia/Kolkata is +05:30 all year: a day ends at 18:30 UTC.
    tz = ZoneInfo("Asia/Kolkata")
    async with api_client(quiet) as client:
        made = await client.put(
            "/v1/boards/cup",
            json={"schedule": "* * * * *", "timezone": "Asia/Kolkata"},
            headers=ADMIN,
        )
        assert made.status_code == 201, made.text
        view = "/v1/boards/cup/leaderboard"

        daily = await client.get(view, params={"period": "daily"})
        assert daily.status_code == 200, daily.text
        day = datetime.fromisoformat(daily.json()["period_id"]).date() + timedelta(days=1)
        ends = _utc(daily.json()["period_ends_at"])
        assert ends == datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)
        assert ends.hour == 18 and ends.minute == 30
        assert datetime.now(UTC) < ends <= datetime.now(UTC) + timedelta(days=1)

        # A season of "* * * * *" is one minute, its id the local minute it starts.
        season = await client.get(view, params={"period": "season", "scope": "region:eu"})
        assert season.status_code == 200, season.text
        start = datetime.fromisoformat(season.json()["period_id"]).replace(tzinfo=tz)
        ends = _utc(season.json()["period_ends_at"])
        assert ends - start == timedelta(minutes=1)
        assert (ends.second, ends.microsecond) == (0, 0)
        assert datetime.now(UTC) - timedelta(seconds=5) < ends
        assert ends <= datetime.now(UTC) + timedelta(minutes=1)

        alltime = await client.get(view, params={"period": "alltime"})
        assert alltime.status_code == 200, alltime.text
        assert "period_ends_at" in alltime.json()
        assert alltime.json()["period_ends_at"] is None
