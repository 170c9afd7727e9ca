"""A page of a view, best first, with a cursor to the next (docs/api.md section 5)."""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis

from services.api.reads.cursors import after_cursor, decode_cursor, encode_cursor
from services.api.reads.entries import entries_of, entry_of, local_ranks, queue_extras
from services.api.reads.friends import friends_rows
from services.api.reads.styles import RankStyle
from services.api.reads.views import Row, View
from shared.keys import Keys
from shared.ranking import id_of


async def _friends_page(
    redis: Redis, keys: Keys, view: View, limit: int, cursor: str | None, style: RankStyle
) -> dict[str, Any]:
    group = await friends_rows(redis, keys, view)
    rows = group.rows
    start = 0
    if cursor is not None:
        after = decode_cursor(cursor)
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
        "next_cursor": encode_cursor(chosen[-1][1], chosen[-1][0]) if more and chosen else None,
    }


async def page(
    redis: Redis,
    keys: Keys,
    view: View,
    limit: int,
    cursor: str | None,
    style: RankStyle = "ordinal",
) -> dict[str, Any]:
    """A page of a view: ``{"total", "entries", "next_cursor"}``."""
    if view.kind == "friends":
        return await _friends_page(redis, keys, view, limit, cursor, style)
    rows: list[Row]
    if cursor is None:
        rows = cast(list[Row], await redis.zrevrange(view.key, 0, limit, withscores=True))
    else:
        stored, member = decode_cursor(cursor)
        rows = await after_cursor(redis, view.key, stored, member, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zcard(view.key)
        if cursor is not None and rows:
            pipe.zrevrank(view.key, rows[0][0])
        queue_extras(pipe, keys, view, rows, style)
        replies = iter(await pipe.execute())
    total = int(next(replies))
    first_rank = 1
    if cursor is not None and rows:
        found = next(replies)
        first_rank = int(found or 0) + 1
    entries = entries_of(view, rows, first_rank, style, replies)
    next_cursor = encode_cursor(rows[-1][1], rows[-1][0]) if more and rows else None
    return {"total": total, "entries": entries, "next_cursor": next_cursor}
