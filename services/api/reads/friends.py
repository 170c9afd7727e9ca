"""The friends scope: the owner and its friends ranked on the global view, with one
``SMEMBERS`` and one ``HMGET`` of their records (tie key, score, metadata: shared/ranking.py),
sorted here exactly as Redis would (score, then member, both descending)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from services.api.reads.views import Row, View
from shared.keys import Keys
from shared.ranking import member, parse_record

# The most friends a friends scope reads; the owner comes on top of them.
MAX_FRIENDS = 1000


@dataclass(frozen=True, slots=True)
class FriendsRows:
    """The group's entries in rank order, and each id's display name and record."""

    rows: list[Row]
    names: dict[str, Any]
    records: dict[str, Any]


async def friends_rows(redis: Redis, keys: Keys, view: View) -> FriendsRows:
    """The owner and its friends that have a score in the view, best first, with their names
    and records."""
    owner = cast(str, view.owner)
    found: set[Any] = await redis.smembers(keys.friends(owner))
    group = [*sorted(found - {owner})[:MAX_FRIENDS], owner]
    async with redis.pipeline(transaction=False) as pipe:
        queue_entries(pipe, view.key, group)
        pipe.hmget(keys.names(view.board.board_id), group)
        records, names = await pipe.execute()
    return FriendsRows(
        rank_locally(group, records),
        dict(zip(group, names, strict=True)),
        dict(zip(group, records, strict=True)),
    )


def queue_entries(pipe: Any, view_key: str, ids: Sequence[str]) -> None:
    """Queue the read of ids' records in a view."""
    pipe.hmget(Keys.ties(view_key), list(ids))


def rank_locally(ids: Sequence[str], records: Sequence[Any]) -> list[Row]:
    """The entries of ids (``queue_entries``' reply) that have a score, in Redis's
    ``ZREVRANGE`` order: score, then member (tie key, then id), descending."""
    rows: list[Row] = []
    for i, raw in zip(ids, records, strict=True):
        if raw is not None:
            tie, signed, _ = parse_record(raw)
            rows.append((member(tie, i), float(signed)))
    rows.sort(key=lambda row: (row[1], row[0]), reverse=True)
    return rows
