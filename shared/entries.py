"""A ranked entry as a leaderboard read shows it, made from a view's member, score and record:
the history snapshots (services/history/snapshotter.py) and the ``period.closed`` messages
(services/aggregator/closer.py) store entries this way. A module of its own so that each
service imports these two functions and none of the other's metrics."""

from __future__ import annotations

from typing import Any

from shared.boards import Board
from shared.ranking import id_of, metadata_of, score_of, sub_of, subscore_of


def user_entry(
    board: Board, rank: int, raw: str, stored: float, name: str | None, record: str | None
) -> dict[str, Any]:
    """A user's entry as a leaderboard read answers it (docs/api.md section 5), from its member
    and score and its record in the view's hash: the metadata kept with the score and, on a
    board with a ``subscore_order``, the subscore, which the member's tie key holds."""
    entry: dict[str, Any] = {
        "rank": rank,
        "user_id": id_of(raw),
        "score": score_of(stored, board.descending),
    }
    if board.subscore_order is not None:
        # A member without a subscore part (none on a board that had one from its first score)
        # has none to show.
        entry["subscore"] = subscore_of(raw, board.subscore_order) if sub_of(raw) else None
    entry["display_name"] = name
    entry["metadata"] = metadata_of(record)
    return entry


def team_entry(board: Board, rank: int, raw: str, stored: float) -> dict[str, Any]:
    """A team's entry as the teams scope of a leaderboard read shows it: no display name, and
    no metadata, which is kept with a user's score, not a team's sum."""
    return {
        "rank": rank,
        "team_id": id_of(raw),
        "score": score_of(stored, board.descending),
        "metadata": None,
    }
