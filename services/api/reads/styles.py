"""Rank styles (docs/api.md section 5).

``ordinal`` is the position. ``competition`` is 1 + how many entries have a strictly better
score: a ``ZCOUNT`` from the next better score (a view's scores are exact signed scores).
``dense`` is 1 + how many distinct scores are strictly better: a ``ZCOUNT`` on the view's
distinct-score set, whose scores are signed scores. A page pays for one such count, for its
first entry, and walks the rest: an equal score keeps the rank; a new one takes the position
(competition) or the previous rank plus one (dense).

On a board with a subscore, entries tie only when score and subscore are both equal: what
compares is the pair (signed score, subscore part of the member; shared/ranking.py), and the
count finds the pair's place among the entries of its score by a binary search over positions
(O(log² n)).

The counts are made in Redis, in the same call as the read they serve (``style_count`` of
shared/lua/read.lua, in ``ladder_page_v1`` and ``ladder_place_v1``); this module walks from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

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
