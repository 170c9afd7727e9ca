"""The friends scope: the owner and its friends ranked on the global view. The friend set is
read first (a key of the user), then one call of the board's keys, ``ladder_friends_v1``, reads
the group's records (tie key, score, metadata: shared/ranking.py), names and the view's as_of;
the rows are sorted here exactly as Redis would (score, then member, both descending)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from services.api.reads.views import Row, View
from shared.functions import FRIENDS_FUNCTION
from shared.keys import Keys
from shared.ranking import member, parse_record

# The most friends a friends scope reads (the first in byte order); the owner comes on top.
MAX_FRIENDS = 1000


@dataclass(frozen=True, slots=True)
class FriendsRows:
    """The group's entries in rank order, and each id's display name and record."""

    rows: list[Row]
    names: dict[str, Any]
    records: dict[str, Any]
    # The field asked for of the board's as_of hash (None where not asked for or not set).
    as_of: Any = None


async def friends_rows(redis: Redis, keys: Keys, view: View, as_of_field: str = "") -> FriendsRows:
    """The owner and its friends that have a score in the view, best first, with their names
    and records, and the field ``as_of_field`` of the board's as_of hash: two round trips, the
    friend set (a key of the user) with the board's hidden users, and then one call of the
    board's keys, since no Redis call
    names keys of two hash tags (docs/architecture.md, invariant 6)."""
    owner, board_id = cast(str, view.owner), view.board.board_id
    # Users hidden on the board are left out (docs/api.md section 8b), the owner too unless it
    # reads its own scope with its player token: a hidden player still sees itself.
    async with redis.pipeline(transaction=False) as pipe:
        pipe.smembers(keys.friends(owner))
        pipe.smembers(keys.hidden(board_id))
        members, hidden = cast(list[set[str]], await pipe.execute())
    group = sorted(i for i in members if i != owner and i not in hidden)
    del group[MAX_FRIENDS:]
    if view.owner_reads or owner not in hidden:
        group.append(owner)
    found: list[Any] = await redis.execute_command(  # type: ignore[no-untyped-call]
        "FCALL_RO",
        FRIENDS_FUNCTION,
        3,
        view.ties,
        keys.names(board_id),
        keys.as_of(board_id),
        as_of_field,
        *group,
    )
    records, names = found[0], found[1]
    return FriendsRows(
        rank_locally(group, records),
        dict(zip(group, names, strict=True)),
        dict(zip(group, records, strict=True)),
        found[2],
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
