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
from shared.derived import derive_pending
from shared.erased_views import Found, erase_from_board
from shared.erasure import Tombstones, user_hash
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
    (the write's, which refuses an erasing user's), and the global view is merged from them.
    A look that failed has the batch delivered again, its events left out by the filter then:
    :meth:`dropped` finds those the apply left and takes them out."""

    def __init__(
        self, redis: Redis, keys: Keys, catalog: BoardCatalog, secret: str, future: float
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._tombstones = Tombstones(redis, keys, secret)
        self._secret = secret
        self._future = timedelta(seconds=future)

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        # A deleted board's events are none of these: its keys go with it.
        _, erased = await self._tombstones.split(events)
        if not erased:
            return
        await self._take_out(erased)
        LATE.inc(len(erased))
        log.info("events of users erased meanwhile taken out after their apply", events=len(erased))

    async def dropped(self, events: list[ScoreAccepted]) -> None:
        """The filter's hand-over of the events it leaves out for their user's erasure (after
        :meth:`Derive.sync_dropped`): those an earlier delivery of the batch applied and its
        look, which failed, left in the board, taken out as this look takes them out. One round
        trip finds them (:meth:`_left_behind`); the removal only for them."""
        boards = {bid: await self._catalog.get(bid) for bid in sorted({e.board_id for e in events})}
        # A deleted board's keys go with it.
        mine = [e for e in events if boards[e.board_id] is not None]
        if not mine:
            return
        left = await self._left_behind(mine)
        if not left:
            return
        await self._take_out(left)
        LATE.inc(len(left))
        log.info("events of erased users left by an earlier delivery taken out", events=len(left))

    async def _left_behind(self, events: list[ScoreAccepted]) -> list[ScoreAccepted]:
        """Of ``events`` (an erased user's, each), those whose derived views may still be in the
        board: their record's first byte and their users' pending erasures in one round trip.

        The erasure's passes delete the user's records after taking the user out of the board
        (services/api/erased_counts.py), so a record still there was either not reached by a
        pass yet or written again after it, by the derive step (a record without the bit) or a
        consumer's seen mark. While the erasure is pending, its second pass is still to come:
        only an event the derive step applied (the bit clear) is taken out now, and one never
        derived is left to the pass, which goes by its record. Once it is done, every record
        left was written after the last pass; the bit alone does not tell then, the history
        consumer setting it again when it takes an applied event out of the counters
        (shared/uncount.py), so any record has the user taken out of the board."""
        users = sorted({e.user_id for e in events})
        async with self._redis.pipeline(transaction=False) as pipe:
            for e in events:
                pipe.getrange(self._keys.idempotency(e.board_id, e.event_id, e.user_id), 0, 0)
            pipe.hmget(self._keys.erasing, [user_hash(u, self._secret) for u in users])
            *firsts, pending = await pipe.execute()
        erasing = {u for u, cutoff in zip(users, pending, strict=True) if cutoff is not None}
        return [
            e
            for e, first in zip(events, firsts, strict=True)
            if first and (e.user_id not in erasing or not derive_pending(first))
        ]

    async def _take_out(self, erased: list[ScoreAccepted]) -> None:
        """Each user of ``erased`` out of each of its boards, and its events out of the counters
        once, their records deleted."""
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
