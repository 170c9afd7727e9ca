"""What a period's close announces (services/aggregator/closer.py; docs/api.md 8b): the final
top of every scope, read from the period's views as a leaderboard read shows it, and the
``period.closed`` message with the ``period_closed`` pushes the close function queues and
publishes."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from shared.boards import Board
from shared.entries import team_entry, user_entry
from shared.keys import Keys
from shared.periods import PeriodWindow
from shared.ranking import id_of

PUSH_TOP = 10
SCHEMA = 1


async def final_tops(
    redis: Redis, keys: Keys, board: Board, window: PeriodWindow, regions: list[str], size: int
) -> dict[str, list[dict[str, Any]]]:
    """The final top ``size`` of every scope, entries as a leaderboard read shows them."""
    bid = board.board_id
    scopes = ["global", *(f"region:{r}" for r in regions)]
    if board.operator == "incr":
        scopes.append("teams")
    view_keys = [keys.board_view(bid, window.period, window.period_id, s) for s in scopes]
    async with redis.pipeline(transaction=False) as pipe:
        for key in view_keys:
            pipe.zrevrange(key, 0, size - 1, True)
        tops: list[list[tuple[str, float]]] = await pipe.execute()
    users = sorted(
        {
            id_of(m)
            for scope, rows in zip(scopes, tops, strict=True)
            if scope != "teams"
            for m, _ in rows
        }
    )
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.names(bid), users or ["-"])
        for scope, key, rows in zip(scopes, view_keys, tops, strict=True):
            if scope != "teams":
                pipe.hmget(Keys.ties(key), [id_of(m) for m, _ in rows] or ["-"])
        replies = iter(await pipe.execute())
    names = dict(zip(users, next(replies), strict=False))
    result: dict[str, list[dict[str, Any]]] = {}
    for scope, rows in zip(scopes, tops, strict=True):
        if scope == "teams":  # on incr boards, as a region: [] when no team scored
            result[scope] = [team_entry(board, i, *row) for i, row in enumerate(rows, 1)]
            continue
        records = next(replies)
        result[scope] = [
            user_entry(board, i, raw, stored, names.get(id_of(raw)), record)
            for i, ((raw, stored), record) in enumerate(zip(rows, records, strict=False), 1)
        ]
    return result


def announced(
    keys: Keys, board: Board, window: PeriodWindow, scopes: dict[str, list[dict[str, Any]]], at: str
) -> list[str]:
    """The close function's message and its pushes: the ``period.closed`` message, then
    each scope's channel and ``period_closed`` push; ``''`` alone where nobody scored (the
    period is claimed, with no message)."""
    if not any(scopes.values()):
        return [""]
    bid, period, pid = board.board_id, window.period, window.period_id
    body = {
        "schema": SCHEMA,
        "type": "period.closed",
        "board_id": bid,
        "period": period,
        "period_id": pid,
        "closed_at": at,
        "scopes": scopes,
    }
    args = [orjson.dumps(body).decode()]
    for scope, entries in scopes.items():
        push = {
            "type": "period_closed",
            "board_id": bid,
            "scope": scope,
            "period": period,
            "period_id": pid,
            "closed_at": at,
            "entries": entries[:PUSH_TOP],
        }
        args += [keys.board_channel(bid, scope, period), orjson.dumps(push).decode()]
    return args
