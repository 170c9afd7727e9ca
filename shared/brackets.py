"""The bracket rule of docs/api.md section 9, shared by the region scope (the notifier, judged on
each update) and the global scope (the aggregator, judged on each merge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Crossing:
    user_id: str
    reason: str  # "entered_top" | "overtaken"
    top: int
    rank: int
    previous_rank: int | None


def smallest_entered(rank: int, previous_rank: int | None, brackets: tuple[int, ...]) -> int | None:
    """The smallest bracket a move from ``previous_rank`` to ``rank`` entered, if any.

    ``None`` as the previous rank is outside every bracket (a first score).
    """
    crossed = [t for t in brackets if rank <= t and (previous_rank is None or previous_rank > t)]
    return min(crossed) if crossed else None


def rank_message(
    crossing: Crossing,
    *,
    board_id: str,
    scope: str,
    period: str,
    period_id: str,
    score: int | None,
) -> dict[str, Any]:
    """The ``rank`` message (docs/api.md section 9) telling ``crossing.user_id`` of its crossing."""
    return {
        "type": "rank",
        "board_id": board_id,
        "scope": scope,
        "period": period,
        "period_id": period_id,
        "user_id": crossing.user_id,
        "rank": crossing.rank,
        "previous_rank": crossing.previous_rank,
        "score": score,
        "reason": crossing.reason,
        "top": crossing.top,
    }
