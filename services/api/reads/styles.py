"""Rank styles (docs/api.md section 5).

``ordinal`` is the position. ``competition`` is 1 + how many entries have a strictly better
score: a ``ZCOUNT`` from the next better score (a view's scores are exact signed scores).
``dense`` is 1 + how many distinct scores are strictly better: a ``ZCOUNT`` on the view's
distinct-score set, whose scores are signed scores. A page pays for one such count, for its
first entry, and walks the rest: an equal score keeps the rank; a new one takes the position
(competition) or the previous rank plus one (dense).

On a board with a subscore, entries tie only when score and subscore are both equal: what
compares is the pair (signed score, subscore part of the member; shared/ranking.py), and the
count is ``ladder_above_v1``, which finds the pair's place among the entries of its score by a
binary search over positions (O(log² n)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from redis.asyncio.client import Pipeline

from shared.functions import ABOVE_FUNCTION
from shared.keys import Keys

RankStyle = Literal["ordinal", "competition", "dense"]

# What two entries must share to tie: the signed score and the subscore part ("" where none).
RankKey = tuple[int, str]


def walk_ranks(
    style: RankStyle, signed: Sequence[RankKey], first_ordinal: int, first_styled: int
) -> list[int]:
    """The ranks of consecutive entries (best first) with these rank keys, the first of which
    sits at position ``first_ordinal`` and has the style's rank ``first_styled``."""
    ranks: list[int] = []
    for i, value in enumerate(signed):
        if style == "ordinal":
            ranks.append(first_ordinal + i)
        elif i == 0:
            ranks.append(first_styled)
        elif value == signed[i - 1]:
            ranks.append(ranks[-1])
        elif style == "competition":
            ranks.append(first_ordinal + i)
        else:
            ranks.append(ranks[-1] + 1)
    return ranks


def queue_style_count(
    pipe: Pipeline, keys: Keys, view_key: str, style: RankStyle, key: RankKey
) -> bool:
    """Queue the count that gives the style's rank of an entry with rank key ``key``; ``False``
    (and nothing queued) for ordinal, whose rank is the position."""
    signed, sub = key
    if style != "ordinal" and sub:
        pipe.fcall_ro(ABOVE_FUNCTION, 2, view_key, keys.distinct(view_key), style, signed, sub)
    elif style == "competition":
        pipe.zcount(view_key, signed + 1, "+inf")
    elif style == "dense":
        pipe.zcount(keys.distinct(view_key), signed + 1, "+inf")
    else:
        return False
    return True
