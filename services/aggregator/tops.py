"""The top-10 pushes of the aggregator's views: a view's top 10 goes to its ``leaderboard``
subscribers (docs/api.md section 10) when it differs from the last one pushed, which a
fingerprint kept beside the view remembers, so several passes or aggregators push a top once.
The fingerprint is stored only once the push has gone out: a push that failed is made again by
the next look at the view, whether or not its top changed meanwhile."""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client import Counter
from redis.asyncio import Redis

from shared.boards import Board
from shared.keys import Keys
from shared.periods import Period
from shared.ranking import id_of, metadata_of, score_of, subscore_of
from shared.submit import board_period_expiry

PUSHES = Counter("ladder_aggregator_top_pushes_total", "Top-10 changes published")

TOP = 10


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


async def push_tops(
    redis: Redis, keys: Keys, board: Board, period: Period, period_id: str, scopes: list[str]
) -> None:
    """Publish the top 10 of each of ``scopes`` of a board period whose top changed since its
    last push (a fingerprint of each view's last pushed top is kept beside it)."""
    bid = board.board_id
    async with redis.pipeline(transaction=False) as pipe:
        for scope in scopes:
            pipe.zrevrange(keys.board_view(bid, period, period_id, scope), 0, TOP - 1, True)
            pipe.get(keys.last_top(bid, period, period_id, scope))
        replies = await pipe.execute()
    members = {id_of(m) for rows in replies[0::2] for m, _ in rows}
    # The tops' display names and records (their metadata), in one round trip.
    async with redis.pipeline(transaction=False) as pipe:
        if members:
            pipe.hmget(keys.names(bid), list(members))
        for scope, rows in zip(scopes, replies[0::2], strict=True):
            if rows:
                view = keys.board_view(bid, period, period_id, scope)
                pipe.hmget(keys.ties(view), [id_of(m) for m, _ in rows])
        found = await pipe.execute()
    names: dict[str, str | None] = dict(zip(members, found.pop(0), strict=True)) if members else {}
    held = iter(found)
    records: list[list[Any]] = [next(held) if rows else [] for rows in replies[0::2]]
    expiry = board_period_expiry(board, period, period_id) or None
    changed: list[tuple[str, str, bytes]] = []  # (scope, fingerprint, message)
    for scope, rows, last, kept in zip(scopes, replies[0::2], replies[1::2], records, strict=True):
        entries = [
            top_entry(board, i + 1, m, c, names.get(id_of(m)), raw)
            for i, ((m, c), raw) in enumerate(zip(rows, kept, strict=True))
        ]
        fingerprint = orjson.dumps(entries).decode()
        if fingerprint == last:
            continue
        message = {
            "type": "leaderboard",
            "board_id": bid,
            "scope": scope,
            "period": period,
            "period_id": period_id,
            "entries": entries,
        }
        changed.append((scope, fingerprint, orjson.dumps(message)))
    if not changed:
        return
    # Every changed scope's push in one round trip, then their fingerprints in another, once the
    # pushes all succeeded: on Redis Cluster a channel's slot is not the board's, and a
    # fingerprint stored beside a publish that failed would keep the top from being pushed
    # again until it changed. A failure between the two only repeats a push.
    async with redis.pipeline(transaction=False) as pipe:
        for scope, _, body in changed:
            pipe.publish(keys.board_channel(bid, scope, period), body)
        await pipe.execute()
    async with redis.pipeline(transaction=False) as pipe:
        for scope, fingerprint, _ in changed:
            pipe.set(keys.last_top(bid, period, period_id, scope), fingerprint)
            if expiry is not None:
                pipe.expireat(keys.last_top(bid, period, period_id, scope), expiry)
        await pipe.execute()
    PUSHES.inc(len(changed))
