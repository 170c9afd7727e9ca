"""Seasons through the API: a schedule in a definition, the season on writes and reads."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from services.api.reads.views import resolve_window
from services.api.routes import definitions
from shared.boards import Board, Retention
from shared.keys import Keys
from shared.periods import expire_at, window_at
from shared.settings import LadderSettings
from shared.submit import board_period_expiry
from tests.helpers import ADMIN, SERVER, api_client, eventually


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database."""
    return quiet


async def test_a_scheduled_board_keeps_seasons_on_writes_and_reads(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        made = await client.put(
            "/v1/boards/cup",
            json={"schedule": "0 18 * * 5", "timezone": "Europe/Berlin"},
            headers=ADMIN,
        )
        assert made.status_code == 201, made.text
        assert made.json()["periods"] == ["daily", "weekly", "monthly", "alltime", "season"]
        assert made.json()["retention"]["season"] == 12
        season = window_at("season", datetime.now(UTC), "Europe/Berlin", "0 18 * * 5").period_id

        body = {"event_id": "e-1", "user_id": "u-1", "region": "eu", "value": 7}
        first = await client.post("/v1/boards/cup/scores", json=body, headers=SERVER)
        assert first.status_code == 200, first.text
        assert first.json()["periods"]["season"]["period_id"] == season
        assert first.json()["periods"]["season"]["rank"] == 1
        again = await client.post("/v1/boards/cup/scores", json=body, headers=SERVER)
        assert again.json()["duplicate"] is True
        assert again.json()["periods"]["season"] == first.json()["periods"]["season"]

        view = "/v1/boards/cup/leaderboard"
        for params in (
            {"scope": "region:eu", "period": "season"},
            {"scope": "region:eu", "period": "season", "period_id": season},
        ):
            page = await client.get(view, params=params)
            assert page.status_code == 200, page.text
            assert page.json()["period_id"] == season
            assert [e["user_id"] for e in page.json()["entries"]] == ["u-1"]
        # Not a Friday 18:00: no season of this board.
        wrong = await client.get(view, params={"period": "season", "period_id": "2026-12-03T18:00"})
        assert wrong.status_code == 422, wrong.text
        standing = await client.get(
            "/v1/boards/cup/users/u-1", params={"scope": "region:eu", "period": "season"}
        )
        assert standing.status_code == 200, standing.text


async def test_boards_without_a_schedule_keep_no_season(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        for body in (
            {"schedule": "* * * *"},
            {"schedule": "0 0 31 2 *"},
            {"schedule": 5},
            {"periods": ["daily", "season"]},
        ):
            refused = await client.put("/v1/boards/cup", json=body, headers=ADMIN)
            assert refused.status_code == 422, (body, refused.text)
            assert refused.headers["content-type"] == "application/problem+json"
        assert (await client.get("/v1/boards/cup")).status_code == 404
        none = await client.get("/v1/boards/main/leaderboard", params={"period": "season"})
        assert none.status_code == 404, none.text
        by_id = await client.get(
            "/v1/boards/main/snapshots",
            params={"period": "season", "period_id": "2026-12-04T18:00"},
        )
        assert by_id.status_code == 404, by_id.text


@pytest.mark.parametrize(
    ("definition", "why"),
    [
        # Yearly seasons kept 10,000 years: past the calendar's end (year 9999).
        ({"schedule": "0 0 1 1 *", "retention": {"season": 10_000}}, "after the year 9999"),
        # Minute seasons kept 3 minutes: gone before their close (lateness 600 s and more).
        ({"schedule": "* * * * *", "retention": {"season": 3}}, "until its close"),
    ],
)
async def test_a_retention_that_leaves_the_calendar_or_ends_before_the_close_is_refused(
    quiet: LadderSettings, definition: dict[str, object], why: str
) -> None:
    async with api_client(quiet) as client:
        refused = await client.put("/v1/boards/cup", json=definition, headers=ADMIN)
        assert refused.status_code == 422, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["errors"][0]["loc"] == ["body", "retention", "season"]
        assert why in refused.json()["detail"]
        assert (await client.get("/v1/boards/cup")).status_code == 404
        # Minute seasons kept 12 minutes outlast the close: accepted.
        kept = {"schedule": "* * * * *", "retention": {"season": 12}}
        assert (await client.put("/v1/boards/cup", json=kept, headers=ADMIN)).status_code == 201


def test_a_stored_retention_past_the_calendar_keeps_forever_instead_of_failing() -> None:
    # A definition stored before such retentions were refused: its writes expire never, and
    # every past season is readable (none is before the oldest kept), rather than a 500.
    board = Board(board_id="cup", schedule="0 0 1 1 *", retention=Retention(season=10_000))
    now = datetime.now(UTC)
    current = window_at("season", now, "UTC", board.schedule)
    assert board_period_expiry(board, "season", current.period_id) == 0
    past = window_at("season", now.replace(year=now.year - 3), "UTC", board.schedule)
    assert resolve_window(board, "season", past.period_id, ahead=5) == past


@pytest.mark.usefixtures("mysql_database")
async def test_a_period_beginning_within_the_future_tolerance_is_readable(
    quiet: LadderSettings,
) -> None:
    """A write takes an ``occurred_at`` up to the future tolerance ahead, and answers with the
    id of the period it fell in, one that may not have begun: a read of that id answered 404
    "not kept" until it began. The season after next (beginning one to two minutes ahead) is
    readable under a tolerance of two minutes, and not under the default five seconds."""
    # The minute after next begins 60 to 120 s from now: never within the default 5 s.
    after_next = window_at("season", datetime.now(UTC) + timedelta(seconds=120), "UTC", "* * * * *")
    path = f"/v1/boards/cup/leaderboard?period=season&period_id={after_next.period_id}"
    board = {"schedule": "* * * * *", "regions": ["eu"]}
    async with api_client(quiet) as client:
        assert (await client.put("/v1/boards/cup", json=board, headers=ADMIN)).status_code == 201
        assert (await client.get(path)).status_code == 404
    wide = quiet.model_copy(update={"future_tolerance_seconds": 120.0})
    async with api_client(wide) as client:
        ahead = datetime.now(UTC) + timedelta(seconds=100)
        event = {"user_id": "u", "region": "eu", "value": 3, "occurred_at": ahead.isoformat()}
        posted = await client.post("/v1/boards/cup/scores", json=event, headers=SERVER)
        assert posted.status_code == 200, posted.text
        named = posted.json()["periods"]["season"]["period_id"]
        read = await client.get(
            f"/v1/boards/cup/leaderboard?scope=region:eu&period=season&period_id={named}"
        )
        assert read.status_code == 200, read.text
        assert [e["user_id"] for e in read.json()["entries"]] == ["u"]
        assert (await client.get(path)).status_code == 200


@pytest.fixture
def raised_again_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed schedule's season keys are raised a second time once the definitions' cache
    lifetime and a margin have passed (5 s and 1 s), and the API's shutdown waits for it: here
    after 1 s and 0.5 s. One process only runs here, and its own cache holds the new definition
    from the PUT on; the key a process holding the old one would make, the test makes itself."""
    monkeypatch.setattr(definitions, "DEFINITION_TTL", 1.0)
    monkeypatch.setattr(definitions, "RAISE_AGAIN_MARGIN", 0.5)


async def test_a_changed_schedule_s_season_is_kept_as_long_as_its_schedule_keeps_it(
    quiet: LadderSettings, redis: Redis, keys: Keys, raised_again_sooner: None
) -> None:
    # Minute seasons, then hourly ones starting at the same minute: the hourly season writes
    # into the keys the minute season made (named by the season id alone), which expire two
    # minutes after it; they must be kept as long as the hourly season's retention says.
    settings = quiet.model_copy(update={"allowed_lateness": 1.0})
    if (second := datetime.now(UTC).second) >= 50:  # both seasons must start this minute
        await asyncio.sleep(60 - second)
    now = datetime.now(UTC)
    hourly = f"{now.minute} * * * *"
    season = window_at("season", now, "UTC", hourly)
    kept_until = expire_at(season, "UTC", 2, hourly)
    assert kept_until is not None and kept_until >= season.end.timestamp() + 2 * 3600
    region_view = keys.region_view("cup", "season", season.period_id, "eu")
    # A key of the season that a process still holding the minute schedule makes after the PUT.
    late = keys.regions("cup", "season", season.period_id)
    definition = {"regions": ["eu"], "retention": {"season": 2}}
    async with api_client(settings) as client:
        put = await client.put(
            "/v1/boards/cup", json=definition | {"schedule": "* * * * *"}, headers=ADMIN
        )
        assert put.status_code == 201, put.text
        await post_score(client, "a")
        minute_expiry = await redis.expiretime(region_view)
        assert 0 < minute_expiry < kept_until

        changing = asyncio.create_task(
            client.put("/v1/boards/cup", json=definition | {"schedule": hourly}, headers=ADMIN)
        )

        async def raised() -> bool:  # the keys that exist are raised before the PUT answers
            return bool(await redis.expiretime(region_view) == kept_until)

        await eventually(raised, within=5.0)
        # (The set holds the region since the first score; made again, it has the old expiry.)
        await redis.sadd(late, "eu")
        await redis.expireat(late, minute_expiry)
        put = await changing  # answered, then raised again once no process holds the old one
        assert put.status_code == 200, put.text
        assert await redis.expiretime(late) == kept_until

        posted = await post_score(client, "b")
        assert posted["periods"]["season"]["period_id"] == season.period_id
        for key in (region_view, keys.ties(region_view)):
            assert await redis.expiretime(key) == kept_until, key
        # The limitation docs/api.md section 3 states: the keys are the minute season's too.
        page = await client.get(
            "/v1/boards/cup/leaderboard", params={"scope": "region:eu", "period": "season"}
        )
        assert page.status_code == 200, page.text
        assert {e["user_id"] for e in page.json()["entries"]} == {"a", "b"}


async def post_score(client: httpx.AsyncClient, user: str) -> dict[str, Any]:
    score = {"event_id": f"e-{user}", "user_id": user, "region": "eu", "value": 1}
    posted = await client.post("/v1/boards/cup/scores", json=score, headers=SERVER)
    assert posted.status_code == 200, posted.text
    answer: dict[str, Any] = posted.json()
    return answer


async def test_a_former_schedule_s_season_is_read_no_more_after_a_change(
    quiet: LadderSettings, raised_again_sooner: None
) -> None:
    """The limit docs/api.md section 3 states: a season id that is no firing of the schedule in
    force is a 422 on reads, a closed season of the schedule before included, snapshots too."""
    async with api_client(quiet) as client:
        kept = {"season": 20}
        made = await client.put(
            "/v1/boards/cup", json={"schedule": "*/2 * * * *", "retention": kept}, headers=ADMIN
        )
        assert made.status_code == 201, made.text
        past = datetime.now(UTC) - timedelta(minutes=3)
        if past.minute < 2:  # a season of the hour's first two minutes: a firing of both
            past -= timedelta(minutes=4)
        body = {"user_id": "u-1", "region": "eu", "value": 7, "occurred_at": past.isoformat()}
        wrote = await client.post("/v1/boards/cup/scores", json=body, headers=SERVER)
        assert wrote.status_code == 200, wrote.text
        season = wrote.json()["periods"]["season"]["period_id"]
        assert not season.endswith(":00")
        read = {"scope": "region:eu", "period": "season", "period_id": season}
        page = await client.get("/v1/boards/cup/leaderboard", params=read)
        assert page.status_code == 200, page.text
        assert [e["user_id"] for e in page.json()["entries"]] == ["u-1"]

        changed = await client.put(
            "/v1/boards/cup", json={"schedule": "0 * * * *", "retention": kept}, headers=ADMIN
        )
        assert changed.status_code == 200, changed.text
        for path in ("leaderboard", "snapshots"):
            gone = await client.get(f"/v1/boards/cup/{path}", params=read)
            assert gone.status_code == 422, gone.text
            assert gone.json()["errors"][0]["loc"] == ["query", "period_id"]
