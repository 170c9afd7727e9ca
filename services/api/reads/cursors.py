"""Cursors of paged reads: the last entry handed out (its sorted-set member and score), opaque
to the client. What comes after one is read by ``ladder_page_v3`` (shared/lua/read.lua): the
entries after the member's position while it still holds the cursor's score, else those below
the score and, at the score, below the member, found by a binary search among that score's
entries. A cursor therefore costs O(log n + page) in Redis wherever it points, O(log² n + page)
when its member moved or left or was made up; never a walk over the entries before it."""

from __future__ import annotations

import base64
import binascii

import orjson

from services.api.errors import Invalid
from shared.ranking import MAX_SCORE, SUB_TAG, tie_width

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
