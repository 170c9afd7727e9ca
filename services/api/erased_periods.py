"""An erased user out of the ``period.closed`` messages still waiting to be published
(docs/api.md section 8b): those in every board's period outbox and in the parked outboxes of
deleted boards (shared/parked_periods.py).

Each message naming the user is rewritten as stored snapshots are (services/api/erased_rows.py):
its entries leave every scope, the others keep the ranks they were taken with. One whose scopes
then all hold no entry goes, as the close writes no message for a period nobody else scored in.
The rewriting is read here and swapped in by ``ladder_erase_period_messages_v2``, which replaces
an entry only if it is still there as read: the relay may publish and delete it meanwhile, and
a message already published is not the outbox's to change. Nor is one the relay is publishing
(services/aggregator/period_relay.py marks it first): the broker may be taking it as it is, and a
rewriting would then follow it under the same ``message_id``, which consumers drop as a copy.
Such an entry is looked at again every ``BUSY_WAIT`` seconds, until the relay has published and
deleted it (it went out as it was) or given up (it was not published: it is rewritten); after
``BUSY_TRIES`` the pass fails, and the erasure worker runs it again after its back-off.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import orjson
from redis.asyncio import Redis

from shared.functions import ERASE_PERIOD_MESSAGES_FUNCTION
from shared.keys import Keys
from shared.parked_periods import parked_set, publishing_marks

PAGE = 100
BUSY_WAIT = 0.1
BUSY_TRIES = 50


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
    """The stream's messages naming the user rewritten, once none of them is being published;
    how many were replaced or removed."""
    done = 0
    for _ in range(BUSY_TRIES):
        replaced, busy = await _erase_once(redis, stream, user_id)
        done += replaced
        if not busy:
            return done
        await asyncio.sleep(BUSY_WAIT)
    raise RuntimeError(f"{stream}: a message naming the user is still being published")


async def _erase_once(redis: Redis, stream: str, user_id: str) -> tuple[int, int]:
    """One look at the stream: messages replaced or removed, and those left as being published."""
    done, busy, start = 0, 0, "-"
    marks = publishing_marks(stream)
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
            call = await redis.fcall(ERASE_PERIOD_MESSAGES_FUNCTION, 2, stream, marks, *args)
            done, busy = done + int(call[0]), busy + int(call[1])
        if len(entries) < PAGE:
            return done, busy
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
