"""Cursors of paged reads: the last entry handed out (its sorted-set member and score), opaque
to the client."""

from __future__ import annotations

import base64
import binascii
from typing import Any, cast

import orjson
from redis.asyncio import Redis

from services.api.errors import Invalid
from services.api.reads.views import Row
from shared.ranking import MAX_SCORE, SUB_TAG, tie_width

# How many tied entries a cursor page skips at most in one fetch before fetching again.
_TIE_SLACK = 32
_HEX = frozenset("0123456789abcdef")


def encode_cursor(stored: float, member: str) -> str:
    raw = orjson.dumps({"s": int(stored), "m": member})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """``(score, member)`` of a cursor; 422 for one this API did not hand out (cursors of the
    earlier layout, of composite scores and bare user ids, included)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
        stored, member = data["s"], data["m"]
        if type(stored) is not int or abs(stored) > MAX_SCORE:
            raise ValueError("not an exact score")
        if not isinstance(member, str) or len(member) <= tie_width(member):
            raise ValueError("not a member")
        hex_from = len(SUB_TAG) if member.startswith(SUB_TAG) else 0
        if not set(member[hex_from : tie_width(member)]) <= _HEX:
            raise ValueError("not a tie key")
        return float(stored), member
    except (binascii.Error, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise Invalid("cursor is not one this server handed out.", loc=("query", "cursor")) from exc


async def after_cursor(redis: Redis, key: str, stored: float, member: str, count: int) -> list[Row]:
    """Up to ``count`` entries that come after ``(stored, member)`` in rank order: the entries
    after the member's position while it is still there (``ZREVRANK``, O(log n + page)); else
    those below its score and, at its score, below it in member order."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrevrank(key, member)
        pipe.zscore(key, member)
        position, now = await pipe.execute()
    # A member still at the cursor's score sits where the cursor was.
    if position is not None and now == stored:
        rows = await redis.zrevrange(key, position + 1, position + count, withscores=True)
        return cast(list[Row], rows)
    return await _after_score(redis, key, stored, member, count)


async def _after_score(redis: Redis, key: str, stored: float, member: str, count: int) -> list[Row]:
    out: list[Row] = []
    offset = 0
    while len(out) < count:
        want = count - len(out) + _TIE_SLACK
        rows: list[Any] = await redis.zrevrangebyscore(
            key, repr(stored), "-inf", start=offset, num=want, withscores=True
        )
        for m, c in rows:
            # Equal scores come in descending member order; skip those already handed out.
            if c == stored and m >= member:
                continue
            out.append((m, c))
        if len(rows) < want:
            break
        offset += len(rows)
    return out[:count]
