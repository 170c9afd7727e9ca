"""Rank styles (docs/api.md section 5).

``ordinal`` is the position. ``competition`` is 1 + how many entries have a strictly better
score: a ``ZCOUNT`` from the next better score (a view's scores are exact signed scores).
``dense`` is 1 + how many distinct scores are strictly better: a ``ZCOUNT`` on the view's
distinct-score set, whose scores are signed scores. A page pays for one such count, for its
first entry, and walks the rest: an equal score keeps the rank; a new one takes the position
(competition) or the previous rank plus one (dense).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from redis.asyncio.client import Pipeline

from shared.keys import Keys
from shared.periods import Period

RankStyle = Literal["ordinal", "competition", "dense"]


def walk_ranks(
    style: RankStyle, signed: Sequence[int], first_ordinal: int, first_styled: int
) -> list[int]:
    """The ranks of consecutive entries (best first) with these signed scores, the first of
    which sits at position ``first_ordinal`` and has the style's rank ``first_styled``."""
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
    pipe: Pipeline, keys: Keys, view_key: str, period: Period, style: RankStyle, signed: int
) -> bool:
    """Queue the count that gives the style's rank of an entry with ``signed``; ``False`` (and
    nothing queued) for ordinal, whose rank is the position."""
    if style == "competition":
        pipe.zcount(view_key, signed + 1, "+inf")
    elif style == "dense":
        pipe.zcount(keys.distinct(view_key), signed + 1, "+inf")
    else:
        return False
    return True
