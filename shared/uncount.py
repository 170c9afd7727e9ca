"""An erased user's events taken out of the boards' live event counters (``stats``), which a
rebuild checks against the history database: each event once, and only if the aggregator's derive
step counted it (docs/api.md section 8b; the erasure's side is services/api/erased_counts.py).
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared.events import ScoreAccepted
from shared.functions import UNCOUNT_EVENTS_FUNCTION, UNCOUNT_FUNCTION
from shared.keys import Keys


async def uncount(
    redis: Redis, keys: Keys, board_id: str, counts: dict[tuple[str, str], int]
) -> None:
    """Take ``counts`` ((period, period_id) -> events) out of the board's live event counters
    (``ladder_uncount_v1``: never below 0, a missing counter left missing)."""
    if not counts:
        return
    names = [keys.event_count(board_id, p, pid) for p, pid in counts]
    await redis.fcall(UNCOUNT_FUNCTION, len(names), *names, *counts.values())


async def uncount_events(
    redis: Redis,
    keys: Keys,
    board_id: str,
    events: list[tuple[str, list[tuple[str, str]]]],
    *,
    drop: bool,
) -> int:
    """Take ``events`` ((record key, the (period, period_id) it counts in)...) out of the board's
    event counters, each once and only if the derive step counted it (``ladder_uncount_events_v1``:
    by its record's derive-pending bit); ``drop`` deletes the records in the same step. Returns
    how many were taken out."""
    if not events:
        return 0
    numbers: dict[tuple[str, str], int] = {}
    per_event: list[str | int] = []
    for _, periods in events:
        mine = [numbers.setdefault(named, len(numbers) + 1) for named in periods]
        per_event += [len(mine), *mine]
    call_keys = [keys.event_count(board_id, p, pid) for p, pid in numbers]
    call_keys += [record for record, _ in events]
    args: list[str | int] = [len(numbers), "1" if drop else "0", *per_event]
    return int(await redis.fcall(UNCOUNT_EVENTS_FUNCTION, len(call_keys), *call_keys, *args))


class Uncount:
    """What the history consumer does with an erased user's event it leaves out: the history
    database will never hold it, while the aggregator may have counted it (derived before the
    erasure). So it is taken out of its periods' counters if it was counted, once, by its record
    (:func:`uncount_events`); an event whose record the erasure's pass deleted already was taken
    out by the pass (services/api/erased_counts.py). It is never given a deleted board's event
    (shared/erasure.py ``skipping``): that board's counters went with its keys, and the record
    of the same ids may be a board's made since under the name."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        by_board: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {}
        for e in events:
            record = self._keys.idempotency(e.board_id, e.event_id, e.user_id)
            periods: list[tuple[str, str]] = [(p, r.period_id) for p, r in e.periods.items()]
            by_board.setdefault(e.board_id, []).append((record, periods))
        for board_id, found in by_board.items():
            await uncount_events(self._redis, self._keys, board_id, found, drop=False)
