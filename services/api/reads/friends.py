"""The friends scope: the owner and its friends ranked on the global view, with one
``SMEMBERS`` and one read of their entries (``ladder_entries_v2``: tie keys and scores), sorted
here exactly as Redis would (score, then member, both descending)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio import Redis

from services.api.reads.views import Row, View
from shared.functions import ENTRIES_FUNCTION
from shared.keys import Keys
from shared.ranking import member

# The most friends a friends scope reads; the owner comes on top of them.
MAX_FRIENDS = 1000


async def friends_rows(redis: Redis, keys: Keys, view: View) -> tuple[list[Row], dict[str, Any]]:
    """The owner and its friends that have a score in the view, best first, and their names."""
    owner = cast(str, view.owner)
    found: set[Any] = await redis.smembers(keys.friends(owner))
    group = [*sorted(found - {owner})[:MAX_FRIENDS], owner]
    async with redis.pipeline(transaction=False) as pipe:
        queue_entries(pipe, view.key, group)
        pipe.hmget(keys.names(view.board.board_id), group)
        found_entries, names = await pipe.execute()
    rows = rank_locally(group, found_entries)
    return rows, dict(zip(group, names, strict=True))


def queue_entries(pipe: Any, view_key: str, ids: Sequence[str]) -> None:
    """Queue the read of ids' entries in a view: their tie keys and scores, flat."""
    pipe.fcall_ro(ENTRIES_FUNCTION, 2, view_key, Keys.ties(view_key), *ids)


def rank_locally(ids: Sequence[str], flat: Sequence[Any]) -> list[Row]:
    """The entries of ids (``queue_entries``' reply) that have a score, in Redis's
    ``ZREVRANGE`` order: score, then member (tie key, then id), descending."""
    rows = [
        (member(tie, i), float(score))
        for i, tie, score in zip(ids, flat[0::2], flat[1::2], strict=True)
        if score is not None
    ]
    rows.sort(key=lambda row: (row[1], row[0]), reverse=True)
    return rows
