"""Cursors of paged reads: the last entry handed out, opaque to the client."""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import orjson
from redis.asyncio import Redis

from services.api.errors import Invalid
from services.api.reads.views import Row

# How many tied entries a cursor page skips at most in one fetch before fetching again.
_TIE_SLACK = 32


def encode_cursor(composite: float, member: str) -> str:
    raw = orjson.dumps({"c": repr(composite), "u": member})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
        composite = float(data["c"])
        if not math.isfinite(composite):
            raise ValueError("not a finite score")
        return composite, str(data["u"])
    except (binascii.Error, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise Invalid("cursor is not one this server handed out.", loc=("query", "cursor")) from exc


async def after_cursor(
    redis: Redis, key: str, composite: float, member: str, count: int
) -> list[Row]:
    """Up to ``count`` entries that come after ``(composite, member)`` in rank order."""
    out: list[Row] = []
    offset = 0
    while len(out) < count:
        want = count - len(out) + _TIE_SLACK
        rows: list[Any] = await redis.zrevrangebyscore(
            key, repr(composite), "-inf", start=offset, num=want, withscores=True
        )
        for m, c in rows:
            # Equal composites come in descending member order; skip those already handed out.
            if c == composite and m >= member:
                continue
            out.append((m, c))
        if len(rows) < want:
            break
        offset += len(rows)
    return out[:count]
