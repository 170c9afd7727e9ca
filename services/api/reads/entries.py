"""Entries of a ranking as the reads answer them: rank in the chosen style, score, name."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from redis.asyncio.client import Pipeline

from services.api.reads.styles import RankStyle, queue_style_count, walk_ranks
from services.api.reads.views import Row, View
from shared.keys import Keys
from shared.ranking import id_of


def local_ranks(style: RankStyle, view: View, rows: Sequence[Row]) -> list[int]:
    """Ranks of a whole ranking held here (a friends scope)."""
    return walk_ranks(style, [view.signed(c) for _, c in rows], 1, 1)


def entry_of(view: View, member: str, stored: float, rank: int, name: Any) -> dict[str, Any]:
    """The entry of a sorted-set member (tie key, then id) and its score."""
    if view.kind == "teams":
        return {"rank": rank, "team_id": id_of(member), "score": view.score(stored)}
    return {
        "rank": rank,
        "user_id": id_of(member),
        "score": view.score(stored),
        "display_name": name,
    }


def queue_extras(
    pipe: Pipeline, keys: Keys, view: View, rows: Sequence[Row], style: RankStyle
) -> None:
    """Queue what turns rows into entries: the display names, the first row's style count."""
    if not rows:
        return
    if view.kind != "teams":
        pipe.hmget(keys.names(view.board.board_id), [id_of(m) for m, _ in rows])
    queue_style_count(pipe, keys, view.key, view.period, style, view.signed(rows[0][1]))


def entries_of(
    view: View, rows: Sequence[Row], first_ordinal: int, style: RankStyle, replies: Iterator[Any]
) -> list[dict[str, Any]]:
    """Entries of rows from the replies :func:`queue_extras` queued, in the same order."""
    if not rows:
        return []
    names: list[Any] = next(replies) if view.kind != "teams" else [None] * len(rows)
    first_styled = first_ordinal if style == "ordinal" else 1 + int(next(replies))
    ranks = walk_ranks(style, [view.signed(c) for _, c in rows], first_ordinal, first_styled)
    return [
        entry_of(view, m, c, rank, name)
        for (m, c), rank, name in zip(rows, ranks, names, strict=True)
    ]
