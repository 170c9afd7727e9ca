"""Reading boards: scopes, periods, pages with cursors, a user's place (API.md section 5)."""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson
from redis.asyncio import Redis

from services.api.errors import Invalid, NotFound
from shared.boards import Board
from shared.events import REGION_PATTERN
from shared.keys import Keys
from shared.periods import Period, PeriodIdError, previous_window, window_at, window_of
from shared.ranking import decode_score

_REGION = re.compile(REGION_PATTERN)
# How many tied entries a cursor page skips at most in one fetch before fetching again.
_TIE_SLACK = 32


@dataclass(frozen=True, slots=True)
class View:
    """One sorted set of one board: a scope in one period."""

    board: Board
    scope: str
    period: Period
    period_id: str
    key: str

    def score(self, composite: float) -> int:
        return decode_score(self.period, composite, self.board.descending)


def resolve_view(
    keys: Keys, board: Board, scope: str, period: Period, period_id: str | None
) -> View:
    """The view a read names; 404 for a period the board does not keep, 422 for nonsense."""
    if scope == "global":
        scope_key = "global"
    elif scope.startswith("region:") and _REGION.match(scope.removeprefix("region:")):
        scope_key = scope
    elif scope.startswith(("friends:", "teams")):
        raise Invalid(
            f"The {scope.split(':')[0]} scope is not available on this server.",
            loc=("query", "scope"),
        )
    else:
        raise Invalid("scope must be 'global' or 'region:<region>'.", loc=("query", "scope"))
    if period not in board.periods:
        raise NotFound(f"Board {board.board_id!r} does not keep a {period} period.")
    current = window_at(period, datetime.now(UTC), board.timezone)
    if period_id is None or period_id == current.period_id:
        window = current
    else:
        try:
            window = window_of(period, period_id, board.timezone)
        except PeriodIdError as exc:
            raise Invalid(str(exc), loc=("query", "period_id")) from exc
        oldest = previous_window(current, board.timezone, board.retention.of(period) or 0)
        if window.start > current.start or window.start < oldest.start:
            raise NotFound(f"Period {period_id!r} is not kept (retention or not yet begun).")
    key = keys.board_view(board.board_id, period, window.period_id, scope_key)
    return View(board, scope, period, window.period_id, key)


def encode_cursor(composite: float, member: str) -> str:
    raw = orjson.dumps({"c": repr(composite), "u": member})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
        composite = float(data["c"])
        if not math.isfinite(composite):
            raise ValueError("not a finite score")
        return composite, str(data["u"])
    except (binascii.Error, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise Invalid("cursor is not one this server handed out.", loc=("query", "cursor")) from exc


async def _after_cursor(
    redis: Redis, key: str, composite: float, member: str, count: int
) -> list[tuple[str, float]]:
    """Up to ``count`` entries that come after ``(composite, member)`` in rank order."""
    out: list[tuple[str, float]] = []
    offset = 0
    while len(out) < count:
        want = count - len(out) + _TIE_SLACK
        rows: list[Any] = await redis.zrevrangebyscore(
            key, repr(composite), "-inf", start=offset, num=want, withscores=True
        )
        for m, c in rows:
            # Equal composites come in descending member order; skip those already handed out.
            if c == composite and m >= member:
                continue
            out.append((m, c))
        if len(rows) < want:
            break
        offset += len(rows)
    return out[:count]


async def page(
    redis: Redis, keys: Keys, view: View, limit: int, cursor: str | None
) -> dict[str, Any]:
    if cursor is None:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zrevrange(view.key, 0, limit, withscores=True)
            pipe.zcard(view.key)
            rows, total = cast(tuple[list[tuple[str, float]], int], await pipe.execute())
        first_rank = 1
    else:
        composite, member = decode_cursor(cursor)
        rows = await _after_cursor(redis, view.key, composite, member, limit + 1)
        total = await redis.zcard(view.key)
        first_rank = 0
        if rows:
            found: Any = await redis.zrevrank(view.key, rows[0][0])
            first_rank = int(found or 0) + 1
    more = len(rows) > limit
    rows = rows[:limit]
    entries = await entries_of(redis, keys, view, rows, first_rank)
    next_cursor = encode_cursor(rows[-1][1], rows[-1][0]) if more and rows else None
    return {"total": total, "entries": entries, "next_cursor": next_cursor}


async def entries_of(
    redis: Redis, keys: Keys, view: View, rows: list[tuple[str, float]], first_rank: int
) -> list[dict[str, Any]]:
    names = await redis.hmget(keys.names(view.board.board_id), [m for m, _ in rows]) if rows else []
    return [
        {"rank": first_rank + i, "user_id": m, "score": view.score(c), "display_name": name}
        for i, ((m, c), name) in enumerate(zip(rows, names, strict=True))
    ]


async def standing(
    redis: Redis, keys: Keys, view: View, user_id: str, around: int
) -> dict[str, Any]:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrevrank(view.key, user_id)
        pipe.zscore(view.key, user_id)
        pipe.zcard(view.key)
        rank0, composite, total = await pipe.execute()
    if rank0 is None or composite is None:
        raise NotFound(f"User {user_id!r} has no score in this view.")
    start = max(rank0 - around, 0)
    rows: list[Any] = await redis.zrevrange(view.key, start, rank0 + around, withscores=True)
    return {
        "user_id": user_id,
        "rank": rank0 + 1,
        "score": view.score(composite),
        "total": total,
        # The share of the board this user ranks at or above, in percent.
        "percentile": round(100.0 * (total - rank0) / total, 2),
        "around": await entries_of(redis, keys, view, rows, start + 1),
    }
