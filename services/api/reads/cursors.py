"""Cursors of paged reads: the last entry handed out (its sorted-set member and score), opaque
to the client. What comes after one is read by ``ladder_page_v3`` (shared/lua/read.lua): the
entries after the member's position while it still holds the cursor's score, else those below
the score and, at the score, below the member, found by a binary search among that score's
entries. A cursor therefore costs O(log n + page) in Redis wherever it points, O(log² n + page)
when its member moved or left or was made up; never a walk over the entries before it.

A cursor names the view that handed it out (a digest of its sorted set's key, which holds the
board, scope, period and period id, and of a friends scope's owner): given to another view it
is a 422, where it would have paged that view from a point of the other one. The rank style
orders nothing, so a cursor serves every style of its view."""

from __future__ import annotations

import base64
import binascii
import hashlib

import orjson

from services.api.errors import Invalid
from services.api.reads.views import View
from shared.ranking import MAX_SCORE, SUB_TAG, tie_width

_HEX = frozenset("0123456789abcdef")


def view_tag(view: View) -> str:
    """What a cursor carries of its view: 12 hex digits of a digest of the view's identity."""
    name = f"{view.key}\n{view.owner or ''}".encode()
    return hashlib.blake2b(name, digest_size=6).hexdigest()


def encode_cursor(view: View, stored: float, member: str) -> str:
    raw = orjson.dumps({"v": view_tag(view), "s": int(stored), "m": member})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(view: View, cursor: str) -> tuple[float, str]:
    """``(score, member)`` of a cursor of ``view``; 422 for one not of the form this API hands
    out (cursors of the earlier layouts included) or handed out for another view. A cursor is
    not signed: one made up in that form reads the view from the point it names."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
        stored, member, tag = data["s"], data["m"], data["v"]
        if type(stored) is not int or abs(stored) > MAX_SCORE:
            raise ValueError("not an exact score")
        if not isinstance(member, str) or len(member) <= tie_width(member):
            raise ValueError("not a member")
        hex_from = len(SUB_TAG) if member.startswith(SUB_TAG) else 0
        if not set(member[hex_from : tie_width(member)]) <= _HEX:
            raise ValueError("not a tie key")
    except (binascii.Error, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise Invalid("cursor is not one this server handed out.", loc=("query", "cursor")) from exc
    if tag != view_tag(view):
        raise Invalid(
            "cursor was handed out by another view: give it with the board, scope, period and "
            "period_id of the read it came from.",
            loc=("query", "cursor"),
        )
    return float(stored), member
