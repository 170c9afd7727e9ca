"""How a ranked sorted set orders its entries: the exact score, then who reached it first.

Every ranked view (regional, team and global boards, every period) is a sorted set whose

- **score** is the exact signed score: the score on ``desc`` boards, its negation on ``asc``
  ones, so that the best is always the highest and every read is ``ZREVRANGE``/``ZREVRANK``.
  Sorted-set scores are doubles, exact for integers up to 2**53: every score within
  ±:data:`MAX_SCORE` is held exactly, on every period;
- **member** is ``<tie key><id>`` (the user id, or the team id on a team board). The tie key is
  of fixed width (:data:`TIE_WIDTH`), so that among equal scores ``ZREVRANGE``'s reverse
  lexicographic order of members puts the greatest tie key first: the tie key is
  ``2**48 - 1 - reached_ms`` in 12 lowercase hex digits, ``reached_ms`` the Unix time in ms at
  which the score was reached, by the events' ``occurred_at`` whatever order they come in
  (shared/lua/write.lua ``new_score()`` says which event's time each operator takes). Whoever
  reached a score first ranks first, to the millisecond, with no end date (2**48 ms is the year
  10889).

Beside each view a hash (``Keys.ties``) holds each id's record (below), so that a write finds
the id's member. Two entries reached in the same millisecond tie exactly and are ordered by id,
the greater first.

On boards with a subscore (``subscore_order``), the tie key starts with a subscore part:
``s`` then 14 hex digits, the greater for the better subscore, then the 12 of the time, so that
equal scores order by subscore in its own direction, then by who got there first. Every member
of a view has the same form (a board's ``subscore_order`` never changes once it has scores); an
``s`` is no hex digit, so a member says by its first character which form it has.

Each id's value in the hash is its **record**: ``<tie key>|<signed score>|<metadata>``, the
metadata the JSON object kept with the entry (empty for none). A write finds the id's member
and score in one ``HGET``; a read of entries finds their metadata in one ``HMGET``.

On a ``set`` board, an entry set again to the score (and subscore) it holds keeps the reach time
of its first reach, for ties, and its record keeps the time of that latest write too, against
which the lateness of the events after it is judged (shared/lua/write.lua ``new_score()``), and
which says which region's entry the global one takes. Its record is then
``<tie key>|<signed score>|<written>|<metadata>``, ``<written>`` 12 hex digits in the form of a
tie key's time part, kept only where it is not the reach time. The metadata is empty or starts
with ``{``, so the field's first character tells; a record without it (every record of another
operator, and every one written before it was kept) was last written when it was reached.

This module is the only definition of the tie key and of the record.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import orjson

MAX_SCORE = (1 << 53) - 1
"""The largest magnitude of a score, on every board, operator, period and team total."""

_TIME_BITS = 48
_TIME_MAX = (1 << _TIME_BITS) - 1
_TIME_WIDTH = 12

SUB_TAG = "s"
_SUB_DIGITS = 14  # 2 * MAX_SCORE < 16**14
SUB_WIDTH = len(SUB_TAG) + _SUB_DIGITS
"""The subscore part's width in characters, its tag included."""

TIE_WIDTH = _TIME_WIDTH
"""The tie key's width on boards without a subscore: 12 hex digits of the time part."""

SubscoreOrder = Literal["asc", "desc"]


def reached_ms(moment: datetime) -> int:
    """The Unix time in ms of ``moment``, clamped into the tie key's range."""
    return min(max(int(moment.timestamp() * 1000), 0), _TIME_MAX)


def sub_part(subscore: int | None, order: SubscoreOrder | None) -> str:
    """The subscore part of a tie key ("" on a board without a subscore): greater for better."""
    if order is None or subscore is None:
        return ""
    offset = subscore + MAX_SCORE
    return f"{SUB_TAG}{offset if order == 'desc' else 2 * MAX_SCORE - offset:014x}"


def tie_key(reached: int, sub: str = "") -> str:
    """The tie key of a score reached at Unix ms ``reached`` with subscore part ``sub``:
    greater for a better subscore, then for earlier."""
    return f"{sub}{_TIME_MAX - reached:012x}"


def tie_width(raw: str) -> int:
    """The width of the tie key that a member (or a tie key) starts with."""
    return SUB_WIDTH + _TIME_WIDTH if raw.startswith(SUB_TAG) else _TIME_WIDTH


def reached_of(tie: str) -> int:
    """The Unix ms a tie key was made from."""
    return _TIME_MAX - int(tie[tie_width(tie) - _TIME_WIDTH : tie_width(tie)], 16)


def sub_of(raw: str) -> str:
    """The subscore part of a member or tie key ("" where none)."""
    return raw[:SUB_WIDTH] if raw.startswith(SUB_TAG) else ""


def subscore_of(raw: str, order: SubscoreOrder) -> int:
    """The subscore of a member or tie key of a board with ``order``."""
    part = int(raw[len(SUB_TAG) : SUB_WIDTH], 16)
    offset = part if order == "desc" else 2 * MAX_SCORE - part
    return offset - MAX_SCORE


def member(tie: str, entry_id: str) -> str:
    return tie + entry_id


def parse_member(raw: str) -> tuple[str, str]:
    """``(tie key, id)`` of a member."""
    width = tie_width(raw)
    return raw[:width], raw[width:]


def id_of(raw: str) -> str:
    """The user or team id of a member."""
    return raw[tie_width(raw) :]


def signed(score: int, descending: bool) -> int:
    """The sorted-set score of ``score``: negated on ascending boards."""
    return score if descending else -score


def score_of(stored: float | str, descending: bool) -> int:
    """The score of a sorted-set score (an exact integer)."""
    value = int(float(stored))
    return value if descending else -value


# -- records ---------------------------------------------------------------------------------


def record(tie: str, signed_score: int, metadata: str = "", written: int | None = None) -> str:
    """An id's record in a view's hash: tie key, signed score, metadata JSON ("" for none), and
    the Unix ms of the latest write where it is not the reach time (``set`` boards only)."""
    if written is None or written == reached_of(tie):
        return f"{tie}|{signed_score}|{metadata}"
    return f"{tie}|{signed_score}|{tie_key(written)}|{metadata}"


def _rest(rest: str) -> tuple[int | None, str]:
    """The latest write's Unix ms (``None``: none kept) and the metadata, of a record's part
    after its score."""
    if rest[:1] in ("", "{"):
        return None, rest
    return _TIME_MAX - int(rest[:_TIME_WIDTH], 16), rest[_TIME_WIDTH + 1 :]


def parse_record(raw: str) -> tuple[str, int, str]:
    """``(tie key, signed score, metadata JSON or "")`` of a record."""
    tie, score, rest = raw.split("|", 2)
    return tie, int(score), _rest(rest)[1]


def written_of(raw: str) -> int | None:
    """The Unix ms of the latest write to a record's entry, where the record keeps it (a ``set``
    entry set again to its score after reaching it); ``None`` where that is its reach time."""
    return _rest(raw.split("|", 2)[2])[0]


def metadata_of(raw: str | None) -> dict[str, Any] | None:
    """The metadata object of a record (``None``: no record, or none kept)."""
    if raw is None:
        return None
    metadata = _rest(raw.split("|", 2)[2])[1]
    return orjson.loads(metadata) if metadata else None
