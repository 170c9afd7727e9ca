"""What the aggregator does with consumed events: mark them dirty for the next merge, and record
them for the live views (:mod:`services.aggregator.live_tracker`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from services.aggregator.fresh import FreshRegions
from shared.events import ScoreAccepted
from shared.keys import Keys, dirty_member

# What handles a consumed batch: the consumer awaits it, and a failure has the batch redelivered.
Handler = Callable[[list[ScoreAccepted]], Awaitable[None]]


class MarkDirty:
    """Idempotent by nature: a set member marked twice is marked once. With ``fresh`` (the
    merger's :class:`~services.aggregator.merge.FreshRegions`), each event's regional views are
    noted there too, for their top-10 pushes, which do not wait for the merge."""

    def __init__(self, redis: Redis, keys: Keys, fresh: FreshRegions | None = None) -> None:
        self._redis = redis
        self._keys = keys
        self._fresh = fresh

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        if self._fresh is not None:
            self._fresh.note(events)
        # One SADD a board and batch, not one an event: the set ends up the same.
        members: dict[str, list[str]] = {}
        for event in events:
            marks = members.setdefault(event.board_id, [])
            region, user_id = event.region, event.user_id
            marks += [
                dirty_member(period, result.period_id, region, user_id)
                for period, result in event.periods.items()
            ]
        boards = [(board_id, marks) for board_id, marks in members.items() if marks]
        if not boards:
            return
        if len(boards) == 1:
            board_id, marks = boards[0]
            await self._redis.sadd(self._keys.dirty(board_id), *marks)
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for board_id, marks in boards:
                pipe.sadd(self._keys.dirty(board_id), *marks)
            await pipe.execute()


class Each:
    """Several handlers, one after the other, on every batch. Each of them is idempotent, so a
    batch redelivered after the first of them succeeded is simply handled again."""

    def __init__(self, *handlers: Handler) -> None:
        self._handlers = handlers

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        for handler in self._handlers:
            await handler(events)


class Alongside:
    """Several handlers at once on every batch, for work that does not wait on the others': each
    sends its own Redis calls one after another, and what one waits for (a reply) the others
    fill. All of them run to their end; the first error, if any, is raised after, so that the
    batch is delivered again (each handler being idempotent, what succeeded is done again as
    nothing)."""

    def __init__(self, *handlers: Handler) -> None:
        self._handlers = handlers

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        outcomes = await asyncio.gather(
            *(handler(events) for handler in self._handlers), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome


def aggregate(derive: Handler, mark_dirty: Handler, record_live: Handler) -> Handler:
    """The aggregator's handler of a batch: derived first, so that a user the merge finds dirty
    has its regions set already, then marked dirty; the live views' records, which need
    neither, alongside."""
    return Alongside(Each(derive, mark_dirty), record_live)
