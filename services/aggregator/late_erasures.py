"""The aggregator's look after each batch it applied (docs/reliability.md, "Erasure and the
outboxes"): the events of a user whose erasure was recorded while the batch went in, taken back
out of Redis, as if the filter before the apply had left them out."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis

from shared.boards import BoardCatalog
from shared.erased_views import Found, erase_from_board
from shared.erasure import Tombstones
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.uncount import uncount_events

log = structlog.get_logger(__name__)

LATE = Counter(
    "ladder_aggregator_late_erased_total",
    "Events applied while their user's erasure was being recorded, taken out again after the apply",
)


class LateErasures:
    """After a batch is applied: its users' tombstones read again from the Redis projection
    (one round trip a batch), and for each event of a user whose erasure was recorded meanwhile
    (accepted at or before its cut-off), on its board, the user taken out of the keys again as
    the erasure's pass takes it (shared/erased_views.py: the feed, the user's team and regions,
    the hot and MVP views, whatever the batch wrote), and the event taken out of its counters
    once, if the apply counted it, its record deleted (by its derive-pending bit,
    shared/uncount.py).

    The filter (shared/erasure.py ``skipping``) reads the tombstones before the apply, and the
    erasure takes the user out in passes that start after its tombstone is recorded; a batch
    filtered before the tombstone and applied after the last pass would leave the user in the
    keys it writes. This look comes after the apply: a tombstone recorded before it is seen
    here, and one recorded after it was recorded after the apply, so the erasure's passes,
    which follow it, find what the batch wrote. The regional views are none of the batch's
    (the write's, which refuses an erasing user's), and the global view is merged from them."""

    def __init__(
        self, redis: Redis, keys: Keys, catalog: BoardCatalog, secret: str, future: float
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._tombstones = Tombstones(redis, keys, secret)
        self._future = timedelta(seconds=future)

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        # A deleted board's events are none of these: its keys go with it.
        _, erased = await self._tombstones.split(events)
        if not erased:
            return
        by_board: dict[str, list[ScoreAccepted]] = defaultdict(list)
        for event in erased:
            by_board[event.board_id].append(event)
        for board_id, board_events in by_board.items():
            board = await self._catalog.get(board_id)
            if board is None:
                continue  # deleted since: its keys go
            seen: dict[str, Found] = defaultdict(Found)
            records: list[tuple[str, list[tuple[str, str]]]] = []
            for e in board_events:
                mine: list[tuple[str, str]] = [
                    (p, r.period_id) for p, r in e.periods.items() if p in board.periods
                ]
                found = seen[e.user_id]
                found.windows.update(mine)
                found.regions.add(e.region)
                if e.team_id is not None:
                    found.team_sets.update(
                        self._keys.team_members(board_id, p, pid, e.team_id) for p, pid in mine
                    )
                records.append((self._keys.idempotency(board_id, e.event_id, e.user_id), mine))
            for user_id in sorted(seen):
                await erase_from_board(
                    self._redis, self._keys, board, user_id, seen[user_id], self._future
                )
            await uncount_events(self._redis, self._keys, board_id, records, drop=True)
        LATE.inc(len(erased))
        log.info("events of users erased meanwhile taken out after their apply", events=len(erased))
