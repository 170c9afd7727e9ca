"""A user's place in one view: rank, score, percentile and neighbours (docs/api.md section 5)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from services.api.errors import Invalid, NotFound
from services.api.reads.entries import entries_of, entry_of, local_ranks
from services.api.reads.friends import friends_rows
from services.api.reads.styles import RankStyle, queue_style_count
from services.api.reads.views import View
from shared.functions import STANDING_FUNCTION
from shared.keys import Keys
from shared.ranking import id_of


def _standing_body(
    user_id: str, rank: int, stored: float, position: int, total: int, view: View
) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "rank": rank,
        "score": view.score(stored),
        "total": total,
        # The share of the board at or below the user's position, in percent.
        "percentile": round(100.0 * (total - position + 1) / total, 2),
    }


async def standing(
    redis: Redis,
    keys: Keys,
    view: View,
    user_id: str,
    around: int,
    style: RankStyle = "ordinal",
) -> dict[str, Any]:
    """A user's rank, score and neighbours in one view; 404 if it has no score there."""
    if view.kind == "teams":
        raise Invalid(
            "The standing read takes a user; a team's place is in the teams leaderboard and in "
            "the user's ranks.",
            loc=("query", "scope"),
        )
    if view.kind == "friends":
        rows, names = await friends_rows(redis, keys, view)
        at = next((i for i, (m, _) in enumerate(rows) if id_of(m) == user_id), None)
        if at is None:
            raise NotFound(f"User {user_id!r} has no score among these friends.")
        ranks = local_ranks(style, view, rows)
        start = max(at - around, 0)
        return {
            **_standing_body(user_id, ranks[at], rows[at][1], at + 1, len(rows), view),
            "around": [
                entry_of(view, m, c, ranks[start + i], names.get(id_of(m)))
                for i, (m, c) in enumerate(rows[start : at + around + 1])
            ],
        }
    # One round trip: position, score, size, the entries around and their names.
    found: list[Any] = await redis.execute_command(  # type: ignore[no-untyped-call]
        "FCALL_RO",
        STANDING_FUNCTION,
        3,
        view.key,
        view.ties,
        keys.names(view.board.board_id),
        user_id,
        around,
    )
    if not found:
        raise NotFound(f"User {user_id!r} has no score in this view.")
    rank0, stored, total = int(found[0]), float(found[1]), int(found[2])
    flat = found[3]
    rows = [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]
    start = max(rank0 - around, 0)
    # Competition and dense ranks take a second: the counts above the user and the first entry.
    counts: list[Any] = []
    if style != "ordinal":
        async with redis.pipeline(transaction=False) as pipe:
            for signed in (view.signed(stored), view.signed(rows[0][1])):
                queue_style_count(pipe, keys, view.key, view.period, style, signed)
            counts = await pipe.execute()
    rank = 1 + int(counts[0]) if counts else rank0 + 1
    extras = iter([found[4], *counts[1:]])
    return {
        **_standing_body(user_id, rank, stored, rank0 + 1, total, view),
        "around": entries_of(view, rows, start + 1, style, extras),
    }
