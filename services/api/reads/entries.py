"""Entries of a ranking as the reads answer them: rank in the chosen style, score, name,
metadata, and the subscore on boards with one."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from services.api.reads.styles import RankStyle, walk_ranks
from services.api.reads.views import Row, View
from shared.ranking import id_of, metadata_of, subscore_of


def local_ranks(style: RankStyle, view: View, rows: Sequence[Row]) -> list[int]:
    """Ranks of a whole ranking held here (a friends scope)."""
    return walk_ranks(style, [view.rank_key(row) for row in rows], 1, 1)


def entry_of(
    view: View, member: str, stored: float, rank: int, name: Any, record: Any = None
) -> dict[str, Any]:
    """The entry of a sorted-set member (tie key, then id) and its score; ``record`` is the
    id's record in the view's hash (shared/ranking.py), which holds its metadata."""
    if view.kind == "teams":
        return {
            "rank": rank,
            "team_id": id_of(member),
            "score": view.score(stored),
            "metadata": None,
        }
    entry = {
        "rank": rank,
        "user_id": id_of(member),
        "score": view.score(stored),
        "display_name": name,
        "metadata": metadata_of(record),
    }
    order = view.board.subscore_order
    if order is not None:
        entry["subscore"] = subscore_of(member, order)
    return entry


def entries_of(
    view: View, rows: Sequence[Row], first_ordinal: int, style: RankStyle, replies: Iterator[Any]
) -> list[dict[str, Any]]:
    """Entries of rows from the replies of ``ladder_page_v3`` or ``ladder_place_v3``: the rows'
    display names and records (not on a team view), then the first row's style count."""
    if not rows:
        return []
    names: list[Any] = [None] * len(rows)
    records: list[Any] = [None] * len(rows)
    if view.kind != "teams":
        names, records = next(replies), next(replies)
    first_styled = first_ordinal if style == "ordinal" else 1 + int(next(replies))
    ranks = walk_ranks(style, [view.rank_key(row) for row in rows], first_ordinal, first_styled)
    return [
        entry_of(view, m, c, rank, name, record)
        for (m, c), rank, name, record in zip(rows, ranks, names, records, strict=True)
    ]
