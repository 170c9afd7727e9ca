"""What the aggregator does with consumed events: mark them dirty for the next merge, and record
them for the live views (:mod:`services.aggregator.live`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from shared.events import ScoreAccepted
from shared.keys import Keys, dirty_member


class MarkDirty:
    """Idempotent by nature: a set member marked twice is marked once."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for event in events:
                members = [
                    dirty_member(period, result.period_id, event.region, event.user_id)
                    for period, result in event.periods.items()
                ]
                pipe.sadd(self._keys.dirty(event.board_id), *members)
            await pipe.execute()


class Each:
    """Several handlers, one after the other, on every batch. Each of them is idempotent, so a
    batch redelivered after the first of them succeeded is simply handled again."""

    def __init__(self, *handlers: Callable[[list[ScoreAccepted]], Awaitable[None]]) -> None:
        self._handlers = handlers

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        for handler in self._handlers:
            await handler(events)
