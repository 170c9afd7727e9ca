"""Whether the aggregator's derive step has applied an event, by its record's derive-pending bit
(shared/lua/live.lua): the write sets it, the derive step clears it as it applies the event. The
rebuild waits on it before it reads the history database, and a period's close before it reads
the views the derive step keeps (the teams scope)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from shared.keys import Keys, parse_event_ref

# The derive-pending bit of a record's marks byte (shared/lua/live.lua, PENDING_BIT 5; marks
# bytes are '@' to 'G'; a record of the layout before starts with a hex digit).
PENDING_MASK = 0x04


def derive_pending(first: str | bytes) -> bool:
    """Whether a record's first byte (``GETRANGE 0 0``; empty: no record) is a marks byte with
    the derive-pending bit set: the write's, not applied by the derive step, or set again by
    :func:`shared.uncount.uncount_events` once it took the event out of the counters."""
    if not first:
        return False
    byte = first.encode("latin-1")[0] if isinstance(first, str) else first[0]
    return 0x40 <= byte < 0x48 and bool(byte & PENDING_MASK)


def records_of(keys: Keys, board_id: str, ref: str) -> tuple[str, str]:
    """The records of the event ``ref`` names (``<event_id>:<user_id>``, shared.keys.event_ref):
    its own, and the one of the layout before under its id alone; a bare id (the newest event
    the write of the layout before noted) has only the latter, given twice."""
    event_id, user_id = parse_event_ref(ref)
    legacy = keys.legacy_idempotency(board_id, event_id)
    if user_id is None:
        return legacy, legacy
    return keys.idempotency(board_id, event_id, user_id), legacy


async def underived(redis: Redis, keys: Keys, board_id: str, refs: list[str]) -> list[str]:
    """Those of the events ``refs`` names that the derive step has yet to apply, in one round
    trip: a record of either layout with its bit set. An event whose records are gone (expired,
    or an erased user's) is waited for no more: no derive step will clear a bit for it."""
    async with redis.pipeline(transaction=False) as pipe:
        for ref in refs:
            for record in records_of(keys, board_id, ref):
                pipe.getrange(record, 0, 0)
        firsts: list[Any] = await pipe.execute()
    return [
        ref
        for ref, own, legacy in zip(refs, firsts[::2], firsts[1::2], strict=True)
        if derive_pending(own) or derive_pending(legacy)
    ]
