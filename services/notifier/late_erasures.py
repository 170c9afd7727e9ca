"""The notifier's look after each batch it wrote (docs/reliability.md, "Erasure and the
outboxes"): the badges and event records it wrote for a user whose erasure, or a board whose
deletion, was recorded while the batch went in, taken back out of Redis, as if the filter
before the write had left the events out."""

from __future__ import annotations

from datetime import UTC, datetime

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis

from shared.erasure import Tombstones, to_ms
from shared.events import ScoreAccepted, rfc3339
from shared.functions import UNAWARD_FUNCTION
from shared.keys import Keys

log = structlog.get_logger(__name__)

LATE = Counter(
    "ladder_notifier_late_erased_total",
    "Events handled while their user's erasure or their board's deletion was being recorded, "
    "their badges and record taken out again after the write",
)


class LateErasures:
    """After a batch is written: its users' tombstones and its boards' deletions read again from
    the Redis projections (one round trip a batch), and for each event of a user erased or a
    board deleted meanwhile (accepted at or before the cut-off), one ``ladder_unaward_v1`` call:
    the user's badges on the board earned up to the cut-off, and the event's record if it holds
    the notifier's mark alone (the one the mark made, the erasure's or deletion's pass having
    deleted the record before).

    The filter (shared/erasure.py ``skipping``) reads the projections before the write, and the
    erasure (the deletion) removes the badges and records in passes that start after its
    projection is written; a batch filtered before it and written after the last pass would
    leave a badge hash with no expiry and a record naming the user for a day. This look comes
    after the write: a projection written before it is seen here, and one written after it was
    written after the write, so the passes, which follow it, find what the batch wrote. The
    rank messages and badge pushes went out already; nothing takes a publish back."""

    def __init__(self, redis: Redis, keys: Keys, secret: str) -> None:
        self._redis = redis
        self._keys = keys
        self._tombstones = Tombstones(redis, keys, secret)

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        users, boards = await self._tombstones.cutoffs(events)
        if not users and not boards:
            return
        late: list[tuple[ScoreAccepted, int]] = []
        for event in events:
            at = to_ms(event.accepted_at)
            covering = [
                c for c in (users.get(event.user_id), boards.get(event.board_id)) if c is not None
            ]
            if covering and at <= max(covering):
                late.append((event, max(covering)))
        if not late:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for event, cutoff in late:
                badges = self._keys.badges(event.board_id, event.user_id)
                record = self._keys.idempotency(event.board_id, event.event_id, event.user_id)
                until = rfc3339(datetime.fromtimestamp(cutoff / 1000, UTC))
                pipe.fcall(UNAWARD_FUNCTION, 2, badges, record, until)
            await pipe.execute()
        LATE.inc(len(late))
        log.info("badges and records of events erased meanwhile taken out", events=len(late))
