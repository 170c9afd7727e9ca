"""A page of a view, best first, with a cursor to the next (docs/api.md section 5)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from services.api.reads.cursors import decode_cursor, encode_cursor
from services.api.reads.entries import entries_of, entry_of, local_ranks
from services.api.reads.friends import friends_rows
from services.api.reads.styles import RankStyle, counted, walked, want_dense
from services.api.reads.views import Row, View
from shared.functions import PAGE_FUNCTION
from shared.keys import Keys
from shared.ranking import id_of
from shared.redis import fcall_ro


async def _friends_page(
    redis: Redis,
    keys: Keys,
    view: View,
    limit: int,
    cursor: str | None,
    style: RankStyle,
    as_of_field: str,
) -> dict[str, Any]:
    group = await friends_rows(redis, keys, view, as_of_field)
    rows = group.rows
    start = 0
    if cursor is not None:
        after = decode_cursor(view, cursor)
        start = next((i for i, (m, c) in enumerate(rows) if (c, m) < after), len(rows))
    ranks = local_ranks(style, view, rows)
    chosen = rows[start : start + limit]
    more = start + limit < len(rows)
    return {
        "total": len(rows),
        "entries": [
            entry_of(
                view, m, c, ranks[start + i], group.names.get(id_of(m)), group.records.get(id_of(m))
            )
            for i, (m, c) in enumerate(chosen)
        ],
        "next_cursor": encode_cursor(view, chosen[-1][1], chosen[-1][0])
        if more and chosen
        else None,
        "as_of": group.as_of,
    }


async def page(
    redis: Redis,
    keys: Keys,
    view: View,
    limit: int,
    cursor: str | None,
    style: RankStyle = "ordinal",
    as_of_field: str = "",
) -> dict[str, Any]:
    """A page of a view: ``{"total", "entries", "next_cursor"}``, and ``"as_of"``: the field
    ``as_of_field`` of the board's as_of hash (``None`` where it is not set or not asked for).

    One round trip: ``ladder_page_v3`` (the rows after the cursor, the view's size, the first
    row's position, names, records and style count, and the as_of); a friends scope takes two,
    the friend set then ``ladder_friends_v1`` (the group's records and names, and the as_of)."""
    if view.kind == "friends":
        return await _friends_page(redis, keys, view, limit, cursor, style, as_of_field)
    after: tuple[Any, ...] = ("", "")
    if cursor is not None:
        stored, member = decode_cursor(view, cursor)
        after = (int(stored), member)
    board_id = view.board.board_id
    found: list[Any] = await fcall_ro(
        redis,
        PAGE_FUNCTION,
        (view.key, view.ties, keys.names(board_id), keys.distinct(view.key), keys.as_of(board_id)),
        limit,
        style,
        *after,
        "" if view.kind == "teams" else "names",
        as_of_field,
    )
    if walked(found[6]):  # a dense count without the view's distinct-score set
        await want_dense(redis, keys, view.board.board_id, [view])
        found[6] = counted(found[6])
    total, first, flat, more = int(found[0]), int(found[1]), found[2], found[3]
    rows: list[Row] = [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]
    # The function's replies in the order entries_of() takes them; a team view has no names.
    replies = [found[6]] if view.kind == "teams" else [found[4], found[5], found[6]]
    entries = entries_of(view, rows, first + 1, style, iter(replies))
    next_cursor = encode_cursor(view, rows[-1][1], rows[-1][0]) if more and rows else None
    return {"total": total, "entries": entries, "next_cursor": next_cursor, "as_of": found[7]}
