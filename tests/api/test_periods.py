"""Periods on the write path: event time, the board's timezone, lateness."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from services.api.errors import Invalid
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.periods import window_at
from shared.settings import LadderSettings
from tests.helpers import stored_score


async def test_periods_of_a_board_in_kiritimati(settings: LadderSettings, redis: Redis) -> None:
    board = Board(board_id="islands", timezone="Pacific/Kiritimati")
    now = datetime.now(UTC)
    answer = await submit(
        redis,
        Keys(settings.key_prefix),
        settings,
        board,
        ScoreIn(user_id="u-1", region="pacific", value=3, occurred_at=now),
        "k-1",
    )
    # UTC+14: the local date is UTC's plus 14 hours.
    local = now + timedelta(hours=14)
    assert answer["periods"]["daily"]["period_id"] == local.date().isoformat()
    year, week, _ = local.date().isocalendar()
    assert answer["periods"]["weekly"]["period_id"] == f"{year}-W{week:02d}"
    assert answer["periods"]["monthly"]["period_id"] == f"{local.year}-{local.month:02d}"


async def test_a_late_event_counts_toward_its_own_period(
    settings: LadderSettings, redis: Redis
) -> None:
    # A generous allowance makes "yesterday" late but allowed.
    lenient = settings.model_copy(update={"allowed_lateness": 2 * 86_400.0})
    keys = Keys(settings.key_prefix)
    board = Board(board_id="late")
    yesterday = datetime.now(UTC) - timedelta(days=1)
    answer = await submit(
        redis,
        keys,
        lenient,
        board,
        ScoreIn(user_id="u-1", region="eu", value=7, occurred_at=yesterday),
        "late-1",
    )
    day = window_at("daily", yesterday, "UTC").period_id
    assert answer["periods"]["daily"]["period_id"] == day
    view = keys.region_view("late", "daily", day, "eu")
    assert await stored_score(redis, view, "u-1", board.descending) == 7
    today = window_at("daily", datetime.now(UTC), "UTC").period_id
    assert await redis.exists(keys.region_view("late", "daily", today, "eu")) == 0


async def test_beyond_the_allowance_is_refused(settings: LadderSettings, redis: Redis) -> None:
    keys = Keys(settings.key_prefix)
    too_old = datetime.now(UTC) - timedelta(seconds=settings.allowed_lateness + 5)
    try:
        await submit(
            redis,
            keys,
            settings,
            Board(board_id="late"),
            ScoreIn(user_id="u-1", region="eu", value=7, occurred_at=too_old),
            "late-2",
        )
    except Invalid as exc:
        assert exc.status == 422
        assert "lateness" in exc.detail
    else:
        raise AssertionError("an event beyond the allowed lateness was accepted")
    assert [k async for k in redis.scan_iter(match="{" + settings.key_prefix + ":late}*")] == []
