"""Turn accepted events into rank pushes on Redis Pub/Sub."""

from __future__ import annotations

import orjson
from prometheus_client import Counter
from redis.asyncio import Redis

from services.notifier.rules import Crossing, crossings
from shared.boards import BoardCatalog
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.periods import Period
from shared.ranking import decode_score

PUSHES = Counter("ladder_notifier_pushes_total", "Rank messages published", ["reason"])
SKIPPED = Counter("ladder_notifier_duplicates_total", "Events already handled, skipped")

SEEN_TTL_SECONDS = 86_400


class Notify:
    """Publishes ``rank`` messages; skips events it has already handled (broker redelivery).

    An event is marked seen only after its messages are published: a crash in between repeats
    them on redelivery rather than losing them.
    """

    def __init__(self, redis: Redis, keys: Keys, catalog: BoardCatalog) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        seen_keys = [self._keys.seen(e.board_id, "notifier", e.event_id) for e in events]
        seen = await self._redis.mget(seen_keys)
        fresh = [e for e, s in zip(events, seen, strict=True) if s is None]
        SKIPPED.inc(len(events) - len(fresh))
        messages: list[tuple[str, dict[str, object]]] = []
        for event in fresh:
            board = await self._catalog.get(event.board_id)
            if board is None:
                continue
            for period, result in event.periods.items():
                for crossing in crossings(event.user_id, result, board.notify_top):
                    messages.append(await self._message(event, period, result.period_id, crossing))
        async with self._redis.pipeline(transaction=False) as pipe:
            for channel, message in messages:
                pipe.publish(channel, orjson.dumps(message))
            for key in (self._keys.seen(e.board_id, "notifier", e.event_id) for e in fresh):
                pipe.set(key, 1, ex=SEEN_TTL_SECONDS)
            await pipe.execute()
        for _, message in messages:
            PUSHES.labels(message["reason"]).inc()

    async def _message(
        self, event: ScoreAccepted, period: Period, period_id: str, crossing: Crossing
    ) -> tuple[str, dict[str, object]]:
        if crossing.user_id == event.user_id:
            score: int | None = event.periods[period].score
        else:
            key = self._keys.region_view(event.board_id, period, period_id, event.region)
            composite = await self._redis.zscore(key, crossing.user_id)
            board = await self._catalog.get(event.board_id)
            descending = board.descending if board else True
            score = decode_score(period, composite, descending) if composite is not None else None
        return self._keys.user_channel(crossing.user_id), {
            "type": "rank",
            "board_id": event.board_id,
            "scope": f"region:{event.region}",
            "period": period,
            "period_id": period_id,
            "user_id": crossing.user_id,
            "rank": crossing.rank,
            "previous_rank": crossing.previous_rank,
            "score": score,
            "reason": crossing.reason,
            "top": crossing.top,
        }
