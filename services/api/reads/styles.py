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
shared/lua/read.lua, in ``ladder_page_v3`` and ``ladder_place_v3``); this module walks from them.

A global or regional view keeps its distinct-score set only once the board is read densely
in its scope (docs/architecture.md, "Dense ranks on demand"); a team view keeps one always.
Until the aggregator has built it, the function counts a dense rank by walking the view's
distinct pairs from the top, at most 1,000 of them, and says so (``[count]``; ``[]`` past that
bound, answered 503 with ``Retry-After``); the read then marks the board and the view for the
aggregator (:func:`want_dense`), one ``SADD`` each, only while the set is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from redis.asyncio import Redis

from services.api.errors import Unavailable
from shared.keys import Keys

RankStyle = Literal["ordinal", "competition", "dense"]

# What two entries must share to tie: the signed score and the subscore part ("" where none).
RankKey = tuple[int, str]

# Seconds a dense read asks to wait while a distinct-score set is built (a million members take
# about a second or two of the aggregator's time, spread over its passes).
DENSE_RETRY_AFTER = 2


def walked(*counts: Any) -> bool:
    """Whether a read function counted a dense rank without the view's distinct-score set."""
    return any(isinstance(count, list) for count in counts)


def counted(count: Any) -> int:
    """A read function's style count as a number: 503 if it was too far down to walk."""
    if isinstance(count, list):
        if not count:
            raise Unavailable(
                "Dense ranks of this view are being prepared (its first dense read); "
                "retry shortly.",
                retry_after=DENSE_RETRY_AFTER,
            )
        return int(count[0])
    return int(count)


async def want_dense(redis: Redis, keys: Keys, board_id: str, views: Sequence[Any]) -> None:
    """Mark the board read densely in these views' scopes, and each view for the aggregator's
    build of its distinct-score set (``views``: :class:`~services.api.reads.views.View` or
    anything with ``scope``, ``period`` and ``period_id``). The scope kind ("global",
    "region") is what the marker holds; the build set names the view's scope whole
    ("region:eu")."""
    async with redis.pipeline(transaction=False) as pipe:
        for view in views:
            pipe.sadd(keys.dense(board_id), view.scope.split(":", 1)[0])
            pipe.sadd(keys.dense_build(board_id), f"{view.period}|{view.period_id}|{view.scope}")
        await pipe.execute()


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
