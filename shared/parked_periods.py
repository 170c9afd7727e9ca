"""A deleted board's ``period.closed`` messages not yet published (docs/api.md section 8b).

The deletion (services/api/eraser.py) does not remove a board's period outbox that holds
entries: it parks it, before its scan of the board's keys and again after it (a close that read
the definition before it went may queue a message meanwhile; the scan leaves the outbox alone),
with ``ladder_park_periods_v2``, renamed to
``{P:B}:periods:parked:<deletion cut-off, ms>``, and notes that name in the set ``P:periods:
parked``. The key keeps the board's hash tag, so the function touches one slot; the deletion's
removal of the board's keys leaves keys of that form alone, and a fresh board of the name writes
its own outbox beside them. The period relay (services/aggregator/period_relay.py) publishes each
parked key's entries as it does an outbox's, and once one holds no entry removes it
(``ladder_drop_parked_v1``) and its name from the set: each message of a period closed before
the deletion goes out once the broker takes it, and nothing of it is left afterwards.
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared.functions import DROP_PARKED_FUNCTION, PARK_PERIODS_FUNCTION
from shared.keys import Keys

PARKED = ":periods:parked:"


def parked_set(keys: Keys) -> str:
    """The set of the parked outboxes' names (no hash tag: the relay reads it alone)."""
    return f"{keys.prefix}:periods:parked"


def parked_outbox(keys: Keys, board_id: str, cutoff_ms: int) -> str:
    """The key a board's period outbox is parked under by its deletion of cut-off ``cutoff_ms``."""
    return f"{keys.tag(board_id)}{PARKED}{cutoff_ms}"


def publishing_marks(stream: str) -> str:
    """The hash of the entries of the period outbox ``stream`` (a board's, or a parked one) that
    the period relay is publishing (``ladder_publishing_period_v1``), each with the time (ms) its
    mark lapses: in the stream's hash tag, and named unlike any parked outbox."""
    tag, _, rest = stream.partition("}")
    return f"{tag}}}:periods:publishing{rest}"


def is_parked(keys: Keys, key: str) -> bool:
    """Whether ``key`` (a key of some board) is a parked period outbox."""
    head = "{" + f"{keys.prefix}:"
    _, found, rest = key.removeprefix(head).partition("}")
    return key.startswith(head) and bool(found) and rest.startswith(PARKED)


async def park(redis: Redis, keys: Keys, board_id: str, cutoff_ms: int) -> int:
    """Park the board's period outbox if it holds entries, and note the parked key's name then
    only; how many entries it held.

    The name is noted on the count the atomic step returns (``ladder_park_periods_v2``: the
    outbox's length read and its entries moved at once), so an entry added to the outbox after
    that step is no entry of this parked key, and a key that got entries always gets its name.
    The set and the outbox cannot share one step: the set has no hash tag (the relay reads it
    alone, for every board), so on Redis Cluster it lies in another slot. A relay that drops the
    name of a key it found empty meanwhile notes it again where entries came (drop_if_empty),
    or finds it again here; a crash between the step and the note leaves the name to the
    deletion's ``SCAN``, which notes every parked key of the board it finds, in this pass or in
    the pass run again (the deletion is done only after a pass that got that far)."""
    parked = parked_outbox(keys, board_id, cutoff_ms)
    call_keys = [keys.periods_outbox(board_id), parked]
    moved = int(await redis.fcall(PARK_PERIODS_FUNCTION, 2, *call_keys))
    if moved:
        await redis.sadd(parked_set(keys), parked)
    return moved


async def drop_if_empty(redis: Redis, keys: Keys, parked: str) -> bool:
    """Forget a parked outbox that holds no entry: its name first, then the key if still empty
    (its name is noted again where a deletion's pass parked entries in it meanwhile)."""
    await redis.srem(parked_set(keys), parked)
    if int(await redis.fcall(DROP_PARKED_FUNCTION, 1, parked)):
        return True
    await redis.sadd(parked_set(keys), parked)
    return False
