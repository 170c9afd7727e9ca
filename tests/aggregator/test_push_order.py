"""The aggregator's pushes and the state that says they were made: a top-10 fingerprint, a live
view's stored value. A push whose PUBLISH fails (on Redis Cluster a channel's slot is not the
board's: its primary may fail over while the board's answers) leaves that state as it was, so
the next look at the view pushes it, whether or not it changed again meanwhile."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from services.aggregator.fresh import FreshRegions
from services.aggregator.live_tracker import LiveViews
from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.aggregator.test_live_views import consumer, outbox, post, recorder
from tests.helpers import api_client, made, refused_publishes
from tests.notifier.test_badges import listening


def users(messages: list[dict[str, Any]]) -> list[list[str]]:
    return [[e["user_id"] for e in m["entries"]] for m in messages]


async def refused(channel: Any, message: Any) -> int:
    """``Redis.publish`` with the channel's node out of reach."""
    raise RedisConnectionError(f"the node of {channel!r} is failing over")


async def test_a_top_whose_push_failed_is_pushed_by_the_next_pass(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=10)
    fresh = FreshRegions()
    fresh.add("main", "alltime", "all", "eu")
    fingerprint = keys.last_top("main", "alltime", "all", "region:eu")
    async with listening(redis, keys.board_channel("main", "region:eu", "alltime")) as channel:
        with refused_publishes(), pytest.raises(ResponseError):
            await fresh.push(redis, keys, MAIN_BOARD)
        assert await redis.get(fingerprint) is None
        assert await channel.drain() == []
        # Nothing changed since, and no event came: the next pass pushes the top all the same.
        assert await fresh.push(redis, keys, MAIN_BOARD) == 1
        assert users(await channel.drain()) == [["u-1"]]
        assert await redis.get(fingerprint) is not None
        # Pushed now: looked at again, it is not pushed twice.
        fresh.add("main", "alltime", "all", "eu")
        await fresh.push(redis, keys, MAIN_BOARD)
        assert await channel.drain() == []


async def test_a_hot_view_whose_push_failed_is_pushed_by_the_next_pass(
    redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    await recorder(redis, keys)([made("u-1", 7, now - timedelta(seconds=1))])
    live = LiveViews(redis, keys)
    async with listening(redis, keys.board_channel("main", "hot", "10")) as channel:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis, "publish", refused)
            with pytest.raises(RedisConnectionError):
                await live.hot(MAIN_BOARD, now=now)
        # Put back as it was: none stored yet.
        assert await redis.get(keys.hot_view("main", 10)) is None
        assert await channel.drain() == []
        assert await live.hot(MAIN_BOARD, now=now) == 2  # both windows, the 10 s one again
        assert users(await channel.drain()) == [["u-1"]]


async def test_an_emptied_hot_view_whose_push_failed_is_pushed_by_the_next_tick(
    redis: Redis, keys: Keys
) -> None:
    now = datetime.now(UTC)
    await recorder(redis, keys)([made("u-1", 7, now - timedelta(seconds=1))])
    live = LiveViews(redis, keys)
    async with listening(redis, keys.board_channel("main", "hot", "10")) as channel:
        await live.hot(MAIN_BOARD, now=now)
        assert users(await channel.drain()) == [["u-1"]]
        # A minute on the event has left both windows and the hot set: the views empty out.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis, "publish", refused)
            with pytest.raises(RedisConnectionError):
                await live.hot(MAIN_BOARD, now=now + timedelta(seconds=65))
        assert await redis.zcard(keys.hot_events("main")) == 0
        # No hot event is left, but the board's view still shows u-1: the ticker computes it
        # again rather than taking it for a quiet board, and pushes the empty view.
        await live.tick([MAIN_BOARD])
        assert users(await channel.drain()) == [[]]


async def test_mvps_whose_push_failed_are_pushed_by_the_next_pass(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    live = LiveViews(redis, keys)
    record = consumer(redis, keys)
    async with api_client(quiet) as client:
        await post(client, user_id="u-1", value=30, team_id="red")
        await record(await outbox(redis, keys))
        assert await live.mvps(MAIN_BOARD) == len(MAIN_BOARD.periods)  # a full pass
        await post(client, user_id="u-2", value=50, team_id="red")
        await record((await outbox(redis, keys))[1:])
    view = keys.mvp_view("main", "alltime")
    stored = await redis.get(view)
    async with listening(redis, keys.board_channel("main", "mvps", "alltime")) as channel:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis, "publish", refused)
            with pytest.raises(RedisConnectionError):
                await live.mvps(MAIN_BOARD)
        assert await redis.get(view) == stored  # put back as it was
        assert await channel.drain() == []
        # Not a full pass (one was made seconds ago): the marks the failed pass took are back.
        assert await live.mvps(MAIN_BOARD) == len(MAIN_BOARD.periods)
        assert users(await channel.drain()) == [["u-2", "u-1"]]
