"""The raise of a season's keys' expiry after its board's schedule changes: which keys it
touches, and that it never lowers an expiry nor gives one to a key that has none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from shared.boards import Board, Retention
from shared.keys import Keys
from shared.periods import SEASON_ID_FORMAT, expire_at, window_at, windows_before
from shared.season_keys import raise_expiry, season_of

HOURLY = "0 * * * *"


async def test_the_keys_of_the_written_seasons_are_raised_and_no_other(
    redis: Redis, keys: Keys
) -> None:
    board = Board(board_id="cup", schedule=HOURLY, retention=Retention(season=2))
    now = datetime.now(UTC)
    current = window_at("season", now, "UTC", HOURLY)
    (before,) = windows_before(current, "UTC", 1, HOURLY)
    soon = int(now.timestamp()) + 60
    stray = (current.start + timedelta(minutes=1)).strftime(SEASON_ID_FORMAT)
    view = keys.region_view("cup", "season", current.period_id, "eu")
    raised = [
        view,
        keys.ties(view),
        keys.regions("cup", "season", current.period_id),
        keys.last_top("cup", "season", current.period_id, "global"),
        keys.team_members("cup", "season", before.period_id, "red"),
    ]
    left = [
        keys.staged("cup", view),  # a rebuild's staging copy
        keys.period_closed("cup", "season", f"{current.period_id}/{soon}"),  # a close's claim
        keys.regions("cup", "season", stray),  # no season of the schedule
        keys.regions("other", "season", current.period_id),  # another board's
    ]
    for key in raised + left:
        await redis.set(key, "1", exat=soon)
    unexpiring = keys.players("cup", "season", current.period_id)
    longer = keys.event_count("cup", "season", before.period_id)
    await redis.set(unexpiring, "1")
    await redis.set(longer, "1", exat=soon + 10**6)

    assert await raise_expiry(redis, keys, board, now, 5.0) == len(raised)
    for key in raised:
        season = current if current.period_id in key else before
        assert await redis.expiretime(key) == expire_at(season, "UTC", 2, HOURLY), key
    for key in left:
        assert await redis.expiretime(key) == soon, key
    assert await redis.expiretime(unexpiring) == -1
    assert await redis.expiretime(longer) == soon + 10**6


def test_a_season_key_is_told_by_its_kind_and_whole_id() -> None:
    keys = Keys("p")
    tag, ids = keys.tag("cup"), {"2026-12-05T23:00": 1}
    assert season_of(keys.distinct(keys.global_view("cup", "season", "2026-12-05T23:00")), tag, ids)
    assert season_of(keys.member_team("cup", "season", "2026-12-05T23:00"), tag, ids)
    assert season_of(keys.mvp_view("cup", "season"), tag, ids) is None
    assert season_of(keys.regions("cup", "daily", "2026-12-05"), tag, ids) is None
    assert season_of(keys.badges("cup", "x:season:2026-12-05T23:00"), tag, ids) is None
