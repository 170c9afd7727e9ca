"""The merge and a period's expiry: the global view's keys keep the expiry they were made with,
as the regional ones do, after the board's retention changes (docs/api.md section 3)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from services.aggregator.merge import Merger
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board, Retention
from shared.keys import Keys, dirty_member
from shared.periods import window_at
from shared.settings import LadderSettings
from tests.helpers import derive_outbox


async def test_the_current_period_keeps_its_expiry_after_a_retention_change(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    before = Board(board_id="ret", periods=("daily",), retention=Retention(daily=35))
    after = before.model_copy(update={"retention": Retention(daily=100)})
    day = window_at("daily", datetime.now(UTC), "UTC", None).period_id
    at = datetime.now(UTC) - timedelta(seconds=1)
    for n, (board, user) in enumerate(((before, "a"), (after, "b"))):
        body = ScoreIn(user_id=user, region="eu", value=5, team_id="red", occurred_at=at)
        await submit(redis, keys, settings, board, body, f"e{n}")
        await derive_outbox(redis, keys, board, settings.feed_length)
        await redis.sadd(keys.dirty("ret"), dirty_member("daily", day, "eu", user))
        await Merger(redis, keys).merge_board(board)
    region = keys.region_view("ret", "daily", day, "eu")
    glob = keys.global_view("ret", "daily", day)
    assert await redis.zcard(glob) == 2
    made = [region, Keys.ties(region), keys.teams_view("ret", "daily", day)]
    merged = [glob, Keys.ties(glob)]
    times = [await redis.expiretime(key) for key in [*made, *merged]]
    assert times[0] > 0
    assert times == [times[0]] * len(times)
