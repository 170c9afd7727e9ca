"""A user's place in one view: rank, score, percentile and neighbours (docs/api.md section 5)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from services.api.errors import Invalid, NotFound
from services.api.reads.entries import entries_of, entry_of, local_ranks
from services.api.reads.friends import friends_rows
from services.api.reads.styles import RankStyle, counted, walked, want_dense
from services.api.reads.views import View
from shared.functions import PLACE_FUNCTION
from shared.keys import Keys
from shared.ranking import id_of
from shared.redis import fcall_ro


def _standing_body(own: dict[str, Any], rank: int, position: int, total: int) -> dict[str, Any]:
    """The standing's body from the user's own entry (``entry_of``): its fields, rank in the
    read's style, size and percentile."""
    body = {
        "user_id": own["user_id"],
        "rank": rank,
        "score": own["score"],
        "total": total,
        # The share of the board at or below the user's position, in percent.
        "percentile": round(100.0 * (total - position + 1) / total, 2),
        "metadata": own["metadata"],
    }
    if "subscore" in own:
        body["subscore"] = own["subscore"]
    return body


async def standing(
    redis: Redis,
    keys: Keys,
    view: View,
    user_id: str,
    around: int,
    style: RankStyle = "ordinal",
    *,
    own: bool = False,
    as_of_field: str = "",
) -> dict[str, Any]:
    """A user's rank, score and neighbours in one view; 404 if it has no score there, or is
    hidden on the board and ``own`` (the read is the user's own, with its player token) is not
    set: a hidden user's own read places it where it would be (docs/api.md section 8b).
    ``"as_of"``: the field ``as_of_field`` of the board's as_of hash, read in the same step
    (``None`` where it is not set or not asked for)."""
    if view.kind == "teams":
        raise Invalid(
            "The standing read takes a user; a team's place is in the teams leaderboard and in "
            "the user's ranks.",
            loc=("query", "scope"),
        )
    if view.kind == "friends":
        group = await friends_rows(redis, keys, view, as_of_field)
        rows = group.rows
        at = next((i for i, (m, _) in enumerate(rows) if id_of(m) == user_id), None)
        if at is None:
            raise NotFound(f"User {user_id!r} has no score among these friends.")
        ranks = local_ranks(style, view, rows)
        start = max(at - around, 0)
        near = [
            entry_of(
                view, m, c, ranks[start + i], group.names.get(id_of(m)), group.records.get(id_of(m))
            )
            for i, (m, c) in enumerate(rows[start : at + around + 1])
        ]
        return {
            **_standing_body(near[at - start], ranks[at], at + 1, len(rows)),
            "around": near,
            "as_of": group.as_of,
        }
    # One round trip: position, score, size, the entries around, their names and records, and
    # the counts of the style's ranks of the user and of the first entry around.
    found: list[Any] = await fcall_ro(
        redis,
        PLACE_FUNCTION,
        (
            view.key,
            view.ties,
            keys.names(view.board.board_id),
            keys.distinct(view.key),
            keys.as_of(view.board.board_id),
        ),
        user_id,
        around,
        style,
        "self" if own else "",
        as_of_field,
    )
    if not found:
        raise NotFound(f"User {user_id!r} has no score in this view.")
    if walked(found[6], found[7]):  # dense counts without the view's distinct-score set
        await want_dense(redis, keys, view.board.board_id, [view])
        found[6], found[7] = counted(found[6]), counted(found[7])
    rank0, total = int(found[0]), int(found[2])
    flat = found[3]
    rows = [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]
    start = max(rank0 - around, 0)
    rank = rank0 + 1 if style == "ordinal" else 1 + int(found[6])
    near = entries_of(view, rows, start + 1, style, iter([found[4], found[5], found[7]]))
    return {
        **_standing_body(near[rank0 - start], rank, rank0 + 1, total),
        "around": near,
        # (A library of the version before, loaded by an older process, replies without it.)
        "as_of": found[8] if len(found) > 8 else None,
    }
