"""The aggregator's pushes and the state that says they were made: a top-10 fingerprint. A
push whose PUBLISH fails (on Redis Cluster a channel's slot is not the board's: its primary may
fail over while the board's answers) leaves that state as it was, so the next look at the view
pushes it, whether or not it changed again meanwhile."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.aggregator.fresh import FreshRegions
from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.aggregator.test_live_views import post
from tests.helpers import api_client, refused_publishes
from tests.notifier.test_badges import listening


def users(messages: list[dict[str, Any]]) -> list[list[str]]:
    return [[e["user_id"] for e in m["entries"]] for m in messages]


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
