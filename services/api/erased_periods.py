"""An erased user out of the ``period.closed`` messages still waiting to be published
(docs/api.md section 8b): those in every board's period outbox and in the parked outboxes of
deleted boards (shared/parked_periods.py).

Each message naming the user is rewritten as stored snapshots are (services/api/erased_rows.py):
its entries leave every scope, the others keep the ranks they were taken with. One whose scopes
then all hold no entry goes, as the close writes no message for a period nobody else scored in.
The rewriting is read here and swapped in by ``ladder_erase_period_messages_v1``, which replaces
an entry only if it is still there as read: the relay may publish and delete it meanwhile, and
a message already published is not the outbox's to change.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
from redis.asyncio import Redis

from shared.functions import ERASE_PERIOD_MESSAGES_FUNCTION
from shared.keys import Keys
from shared.parked_periods import parked_set

PAGE = 100


def without_user(message: str, user_id: str) -> str | None:
    """``message`` rewritten without the user's entries ('' if no entry is left in any scope);
    None if it does not name the user (or is no message)."""
    try:
        body = orjson.loads(message)
        scopes: dict[str, list[dict[str, Any]]] = body["scopes"]
        named = any(e.get("user_id") == user_id for es in scopes.values() for e in es)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    if not named:
        return None
    kept = {s: [e for e in es if e.get("user_id") != user_id] for s, es in scopes.items()}
    if not any(kept.values()):
        return ""
    body["scopes"] = kept
    return orjson.dumps(body).decode()


async def erase_from_outbox(redis: Redis, stream: str, user_id: str) -> int:
    """The stream's messages naming the user rewritten; how many were replaced or removed."""
    done, start = 0, "-"
    while True:
        entries = cast(
            list[tuple[str, dict[str, str]]], await redis.xrange(stream, start, count=PAGE)
        )
        args: list[str] = []
        for entry_id, fields in entries:
            message = fields.get("m", "")
            rewritten = without_user(message, user_id) if message else None
            if rewritten is not None:
                args += [entry_id, message, rewritten]
        if args:
            done += int(await redis.fcall(ERASE_PERIOD_MESSAGES_FUNCTION, 1, stream, *args))
        if len(entries) < PAGE:
            return done
        start = "(" + entries[-1][0]


async def erase_from_period_outboxes(
    redis: Redis, keys: Keys, board_ids: list[str], user_id: str
) -> int:
    """Every board's period outbox and every parked one that holds entries (one pipelined
    ``XLEN`` for each ``PAGE`` of them), each in a call of its own (one hash tag each); how many
    messages were replaced or removed."""
    parked: set[str] = await redis.smembers(parked_set(keys))  # type: ignore[assignment]
    streams = [keys.periods_outbox(board_id) for board_id in board_ids] + sorted(parked)
    done = 0
    for at in range(0, len(streams), PAGE):
        chunk = streams[at : at + PAGE]
        async with redis.pipeline(transaction=False) as pipe:
            for stream in chunk:
                pipe.xlen(stream)
            lengths = await pipe.execute()
        for stream, length in zip(chunk, lengths, strict=True):
            if length:
                done += await erase_from_outbox(redis, stream, user_id)
    return done
