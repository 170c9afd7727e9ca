"""The notifier's seen marks: an event is marked handled only once its messages are published, so
a batch whose publishes failed is handled again, whole, on its redelivery."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.notifier.handlers import Notify
from shared.boards import BoardCatalog
from shared.keys import Keys
from tests.helpers import refused_publishes
from tests.notifier.test_badges import (
    NOTIFIER_BIT,
    QUEST,
    accepted,
    add_board,
    badge_message,
    listening,
)


@pytest.fixture
async def notify(redis: Redis, keys: Keys) -> Notify:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    await add_board(redis, keys, QUEST)
    return Notify(redis, keys, catalog)


async def test_an_event_whose_rank_push_failed_is_not_marked_and_pushes_on_redelivery(
    notify: Notify, redis: Redis, keys: Keys
) -> None:
    event = accepted(150)  # enters the top, and earns the bronze badge
    record = keys.idempotency("quest", event.event_id, event.user_id)
    async with listening(redis, keys.user_channel("u-1")) as channel:
        with refused_publishes(), pytest.raises(ResponseError):
            await notify([event])
        # The badge's own call went through; the rank message did not, nor did the mark.
        assert await redis.getbit(record, NOTIFIER_BIT) == 0
        assert await channel.drain() == [badge_message("bronze")]
        # The broker delivers the batch again: the rank message goes out, the badge not again.
        await notify([event])
        assert await redis.getbit(record, NOTIFIER_BIT) == 1
        heard = await channel.drain()
    assert [m["reason"] for m in heard if m["type"] == "rank"] == ["entered_top"]
    assert [m for m in heard if m["type"] == "badge"] == []
    # Handled now: a further delivery pushes nothing.
    async with listening(redis, keys.user_channel("u-1")) as channel:
        await notify([event])
        assert await channel.drain() == []
