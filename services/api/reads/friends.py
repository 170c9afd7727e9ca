"""The friends scope: the owner and its friends ranked on the global view, with one
``SMEMBERS`` and one batched ``ZMSCORE``, sorted here exactly as Redis would (composite, then
member, both descending)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio import Redis

from services.api.reads.views import Row, View
from shared.keys import Keys

# The most friends a friends scope reads; the owner comes on top of them.
MAX_FRIENDS = 1000


async def friends_rows(redis: Redis, keys: Keys, view: View) -> tuple[list[Row], dict[str, Any]]:
    """The owner and its friends that have a score in the view, best first, and their names."""
    owner = cast(str, view.owner)
    found: set[Any] = await redis.smembers(keys.friends(owner))
    group = [*sorted(found - {owner})[:MAX_FRIENDS], owner]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zmscore(view.key, group)
        pipe.hmget(keys.names(view.board.board_id), group)
        composites, names = await pipe.execute()
    rows = rank_locally(group, composites)
    return rows, dict(zip(group, names, strict=True))


def rank_locally(members: Sequence[str], composites: Sequence[float | None]) -> list[Row]:
    """Members with a score, in Redis's ``ZREVRANGE`` order: composite, then member, descending."""
    rows = [(m, c) for m, c in zip(members, composites, strict=True) if c is not None]
    rows.sort(key=lambda row: (row[1], row[0]), reverse=True)
    return rows
