"""The top-10 pushes of the aggregator's views: a view's top 10 goes to its ``leaderboard``
subscribers (docs/api.md section 10) when it differs from the last one pushed, which a
fingerprint kept beside the view remembers, so several passes or aggregators push a top once.

The push and the fingerprint go together, in one step that makes them only while the fingerprint
key holds what the caller read before it read the top (``ladder_top_push_v1``,
shared/lua/tops.lua): a push that failed stored nothing, and is made again by the next look at
the view, whether or not its top changed meanwhile; and of two aggregators pushing one view (each
pushes the regions its own batches touched, and the merge's holder the views it merged), the one
that read first cannot push after the other, since the other's push changed the key: it reads
the view again. So an older top never follows a newer one.
"""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client import Counter
from redis.asyncio import Redis

from shared.boards import Board
from shared.functions import TOP_PUSH_FUNCTION
from shared.keys import Keys
from shared.periods import Period
from shared.ranking import id_of, metadata_of, score_of, subscore_of
from shared.submit import board_period_expiry

PUSHES = Counter("ladder_aggregator_top_pushes_total", "Top-10 changes published")

TOP = 10
# Looks at a view whose push another push reached first, one after the other, before it is
# left to the caller's next look.
ATTEMPTS = 3


def top_entry(
    board: Board, rank: int, member: str, stored: float, name: str | None, raw: str | None
) -> dict[str, Any]:
    """A ``leaderboard`` push's entry, shaped as the reads' (docs/api.md section 5)."""
    entry: dict[str, Any] = {
        "rank": rank,
        "user_id": id_of(member),
        "score": score_of(stored, board.descending),
        "display_name": name,
        "metadata": metadata_of(raw),
    }
    if board.subscore_order is not None:
        entry["subscore"] = subscore_of(member, board.subscore_order)
    return entry


def fingerprint_of(stored: str | None) -> str | None:
    """The fingerprint of the last top pushed, from the fingerprint key's value
    "<version>|<fingerprint>" (a value stored before versions: the fingerprint alone)."""
    if stored is None or stored.startswith("["):
        return stored
    return stored.partition("|")[2]


async def push_tops(
    redis: Redis, keys: Keys, board: Board, period: Period, period_id: str, scopes: list[str]
) -> list[str]:
    """Publish the top 10 of each of ``scopes`` of a board period whose top changed since its
    last push (a fingerprint of each view's last pushed top is kept beside it). A view another
    push reached first is read again, up to ``ATTEMPTS`` times; returns the scopes still left
    so, for the caller to look at again later (a push that fails raises)."""
    left = scopes
    for _ in range(ATTEMPTS):
        left = await _push(redis, keys, board, period, period_id, left)
        if not left:
            break
    return left


async def _push(
    redis: Redis, keys: Keys, board: Board, period: Period, period_id: str, scopes: list[str]
) -> list[str]:
    """One look at each of ``scopes``: its top pushed if it changed; returns those another
    push reached first."""
    bid = board.board_id
    async with redis.pipeline(transaction=False) as pipe:
        for scope in scopes:
            # The fingerprint before the top: a top read after another push went out is newer
            # than the one that push made (shared/lua/tops.lua).
            pipe.get(keys.last_top(bid, period, period_id, scope))
            pipe.zrevrange(keys.board_view(bid, period, period_id, scope), 0, TOP - 1, True)
        replies = await pipe.execute()
    tops: list[list[Any]] = replies[1::2]
    members = {id_of(m) for rows in tops for m, _ in rows}
    # The tops' display names and records (their metadata), in one round trip.
    async with redis.pipeline(transaction=False) as pipe:
        if members:
            pipe.hmget(keys.names(bid), list(members))
        for scope, rows in zip(scopes, tops, strict=True):
            if rows:
                view = keys.board_view(bid, period, period_id, scope)
                pipe.hmget(keys.ties(view), [id_of(m) for m, _ in rows])
        found = await pipe.execute()
    names: dict[str, str | None] = dict(zip(members, found.pop(0), strict=True)) if members else {}
    held = iter(found)
    records: list[list[Any]] = [next(held) if rows else [] for rows in tops]
    changed: list[tuple[str, str, str, bytes]] = []  # (scope, read, fingerprint, message)
    for scope, rows, last, kept in zip(scopes, tops, replies[0::2], records, strict=True):
        entries = [
            top_entry(board, i + 1, m, c, names.get(id_of(m)), raw)
            for i, ((m, c), raw) in enumerate(zip(rows, kept, strict=True))
        ]
        fingerprint = orjson.dumps(entries).decode()
        if fingerprint == fingerprint_of(last):
            continue
        message = {
            "type": "leaderboard",
            "board_id": bid,
            "scope": scope,
            "period": period,
            "period_id": period_id,
            "entries": entries,
        }
        changed.append((scope, last or "", fingerprint, orjson.dumps(message)))
    if not changed:
        return []
    expiry = board_period_expiry(board, period, period_id)
    pushed = await publish_tops(redis, keys, board, period, period_id, changed, expiry)
    PUSHES.inc(sum(pushed))
    return [scope for (scope, *_), done in zip(changed, pushed, strict=True) if not done]


async def publish_tops(
    redis: Redis,
    keys: Keys,
    board: Board,
    period: Period,
    period_id: str,
    changed: list[tuple[str, str, str, bytes]],
    expiry: int,
) -> list[int]:
    """The changed tops' pushes, each with its fingerprint in one step, in one round trip (the
    views' keys share the board's node); 1 for each pushed, 0 for each another push reached
    first."""
    bid = board.board_id
    async with redis.pipeline(transaction=False) as pipe:
        for scope, read, fingerprint, body in changed:
            key = keys.last_top(bid, period, period_id, scope)
            channel = keys.board_channel(bid, scope, period)
            pipe.fcall(TOP_PUSH_FUNCTION, 1, key, read, fingerprint, expiry, channel, body)
        return [int(done) for done in await pipe.execute()]
