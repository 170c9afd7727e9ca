"""Entries of a ranking as the reads answer them: rank in the chosen style, score, name,
metadata, and the subscore on boards with one."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from services.api.reads.styles import RankStyle, walk_ranks
from services.api.reads.views import Row, View
from shared.ranking import id_of, metadata_of, subscore_of, tie_width


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
    if style == "ordinal":  # the positions: no rank keys to compare
        ranks: Sequence[int] = range(first_ordinal, first_ordinal + len(rows))
    else:
        first_styled = 1 + int(next(replies))
        ranks = walk_ranks(style, [view.rank_key(row) for row in rows], first_ordinal, first_styled)
    if view.kind == "teams":
        return [
            entry_of(view, m, c, rank, name, record)
            for (m, c), rank, name, record in zip(rows, ranks, names, records, strict=True)
        ]
    # entry_of's users' entries, what is the same for every row looked up once (11 entries:
    # 10.1 → 6.9 µs of CPU); tests/api/test_entries.py holds them equal.
    descending, order = view.board.descending, view.board.subscore_order
    entries = []
    for (member, stored), rank, name, record in zip(rows, ranks, names, records, strict=True):
        score = int(float(stored))
        entry = {
            "rank": rank,
            "user_id": member[tie_width(member) :],
            "score": score if descending else -score,
            "display_name": name,
            "metadata": metadata_of(record),
        }
        if order is not None:
            entry["subscore"] = subscore_of(member, order)
        entries.append(entry)
    return entries
