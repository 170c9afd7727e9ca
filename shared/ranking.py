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
  which the score was reached. Whoever reached a score first ranks first, to the millisecond,
  with no end date (2**48 ms is the year 10889).

Beside each view a hash (``Keys.ties``) holds each id's current tie key, so that a write finds
the id's member. Two entries reached in the same millisecond tie exactly and are ordered by id,
the greater first.

This module is the only definition of the tie key: a later subscore part goes in front of the
time part here (:func:`tie_key`), with :data:`TIE_WIDTH` growing to match.
"""

from __future__ import annotations

from datetime import datetime

MAX_SCORE = (1 << 53) - 1
"""The largest magnitude of a score, on every board, operator, period and team total."""

_TIME_BITS = 48
_TIME_MAX = (1 << _TIME_BITS) - 1

TIE_WIDTH = 12
"""The tie key's width in characters: 12 hex digits of the time part."""


def reached_ms(moment: datetime) -> int:
    """The Unix time in ms of ``moment``, clamped into the tie key's range."""
    return min(max(int(moment.timestamp() * 1000), 0), _TIME_MAX)


def tie_key(reached: int) -> str:
    """The tie key of a score reached at Unix ms ``reached``: greater for earlier."""
    return f"{_TIME_MAX - reached:012x}"


def reached_of(tie: str) -> int:
    """The Unix ms a tie key was made from."""
    return _TIME_MAX - int(tie[-12:], 16)


def member(tie: str, entry_id: str) -> str:
    return tie + entry_id


def parse_member(raw: str) -> tuple[str, str]:
    """``(tie key, id)`` of a member."""
    return raw[:TIE_WIDTH], raw[TIE_WIDTH:]


def id_of(raw: str) -> str:
    """The user or team id of a member."""
    return raw[TIE_WIDTH:]


def signed(score: int, descending: bool) -> int:
    """The sorted-set score of ``score``: negated on ascending boards."""
    return score if descending else -score


def score_of(stored: float | str, descending: bool) -> int:
    """The score of a sorted-set score (an exact integer)."""
    value = int(float(stored))
    return value if descending else -value
