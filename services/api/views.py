"""Reading boards: scopes, periods, pages with cursors, rank styles, a user's place (API.md
section 5).

Every scope but ``friends`` is one sorted set, read with ``ZREVRANGE`` and friends. A friends
scope is the owner and its friends ranked on the global view: one ``SMEMBERS``, then one batched
``ZMSCORE``, sorted here exactly as Redis would (composite, then member, both descending).

Rank styles: ``ordinal`` is the position. ``competition`` is 1 + how many entries have a strictly
better score: a ``ZCOUNT`` from the lowest composite of the next better score. ``dense`` is 1 +
how many distinct scores are strictly better: a ``ZCOUNT`` on the view's distinct-score set,
whose scores are signed scores. A page pays for one such count, for its first entry, and walks
the rest: an equal score keeps the rank; a new one takes the position (competition) or the
previous rank plus one (dense).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

import orjson
from fastapi import Query
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from services.api.auth import Principal
from services.api.errors import Forbidden, Invalid, NotFound, Unauthorized
from shared.boards import Board
from shared.events import REGION_PATTERN, USER_ID_PATTERN
from shared.functions import STANDING_FUNCTION
from shared.keys import Keys
from shared.periods import (
    PERIODS,
    Period,
    PeriodIdError,
    PeriodWindow,
    previous_window,
    window_at,
    window_of,
)
from shared.ranking import ENCODINGS, decode_score

RankStyle = Literal["ordinal", "competition", "dense"]
ScopeKind = Literal["users", "teams", "friends"]

SCOPE_PATTERN = (
    r"^(global|teams|region:[a-z0-9][a-z0-9_-]{0,31}|friends:[A-Za-z0-9][A-Za-z0-9_.:-]{0,63})$"
)
PERIOD_ID_PATTERN = r"^(\d{4}-\d{2}-\d{2}|\d{4}-W\d{2}|\d{4}-\d{2}|all)$"
# A read's `period_id` query: one period of the chosen kind, the current one when left out.
PeriodIdQuery = Annotated[
    str | None,
    Query(max_length=16, pattern=PERIOD_ID_PATTERN, description="Defaults to the current period"),
]
# The most friends a friends scope reads; the owner comes on top of them.
MAX_FRIENDS = 1000

_REGION = re.compile(REGION_PATTERN)
_USER_ID = re.compile(USER_ID_PATTERN)
# How many tied entries a cursor page skips at most in one fetch before fetching again.
_TIE_SLACK = 32

Row = tuple[str, float]


@dataclass(frozen=True, slots=True)
class View:
    """One ranking of one board: a scope in one period.

    ``key`` is the sorted set read: the scope's own, or for ``friends`` the global view, of
    which only the owner and its friends are ranked.
    """

    board: Board
    scope: str
    period: Period
    period_id: str
    key: str
    kind: ScopeKind = "users"
    owner: str | None = None

    def score(self, composite: float) -> int:
        return decode_score(self.period, composite, self.board.descending)

    def signed(self, composite: float) -> int:
        """The signed score of a composite: the score, negated on ascending boards."""
        return int(composite) // ENCODINGS[self.period].scale


# --- resolving what a read names --------------------------------------------------------------


def resolve_window(board: Board, period: Period, period_id: str | None) -> PeriodWindow:
    """The period a read names: 404 for one the board does not keep (not a board period, past
    retention, not yet begun), 422 for an id that names no period."""
    if period not in board.periods:
        raise NotFound(f"Board {board.board_id!r} does not keep a {period} period.")
    current = window_at(period, datetime.now(UTC), board.timezone)
    if period_id is None or period_id == current.period_id:
        return current
    try:
        window = window_of(period, period_id, board.timezone)
    except PeriodIdError as exc:
        raise Invalid(str(exc), loc=("query", "period_id")) from exc
    oldest = previous_window(current, board.timezone, board.retention.of(period) or 0)
    if window.start > current.start or window.start < oldest.start:
        raise NotFound(f"Period {period_id!r} is not kept (retention or not yet begun).")
    return window


def period_of_id(board: Board, period_id: str) -> Period:
    """Which kind of period an id names (the four formats differ); 404 if the board does not
    keep that kind, 422 if it names none."""
    for period in PERIODS:
        try:
            window_of(period, period_id, board.timezone)
        except PeriodIdError:
            continue
        if period not in board.periods:
            raise NotFound(f"Board {board.board_id!r} does not keep a {period} period.")
        return period
    raise Invalid(f"{period_id!r} is not a period id.", loc=("query", "period_id"))


def check_friends_reader(reader: Principal, owner: str) -> None:
    """A friends scope is private: the player itself or a server or admin key."""
    if reader.kind == "anonymous":
        raise Unauthorized("A friends scope is read by its player or with a server key.")
    if not reader.may_act_for(owner):
        raise Forbidden("A player may read only its own friends scope.")


def resolve_view(
    keys: Keys,
    board: Board,
    scope: str,
    period: Period,
    period_id: str | None,
    *,
    reader: Principal | None = None,
) -> View:
    """The view a read names: 422 for a scope that is nonsense or not on this board, 401/403
    for a friends scope the reader may not see (without a ``reader``, friends scopes are not
    offered), 404 for a period the board does not keep."""
    kind: ScopeKind = "users"
    owner: str | None = None
    if scope == "global" or (
        scope.startswith("region:") and _REGION.fullmatch(scope.removeprefix("region:"))
    ):
        pass
    elif scope == "teams":
        if board.operator != "incr":
            raise Invalid(
                f"The teams scope sums members' scores and exists only on incr boards; board "
                f"{board.board_id!r} is {board.operator}.",
                loc=("query", "scope"),
            )
        kind = "teams"
    elif scope.startswith("friends:") and _USER_ID.fullmatch(scope.removeprefix("friends:")):
        if reader is None:
            raise Invalid(
                "The friends scope is not available on this read.", loc=("query", "scope")
            )
        kind, owner = "friends", scope.removeprefix("friends:")
        check_friends_reader(reader, owner)
    else:
        raise Invalid(
            "scope must be 'global', 'region:<region>', 'teams' or 'friends:<user_id>'.",
            loc=("query", "scope"),
        )
    window = resolve_window(board, period, period_id)
    bid, pid = board.board_id, window.period_id
    if kind == "friends":
        key = keys.global_view(bid, period, pid)
    else:
        key = keys.board_view(bid, period, pid, scope)
    return View(board, scope, period, pid, key, kind, owner)


# --- cursors -----------------------------------------------------------------------------------


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
) -> list[Row]:
    """Up to ``count`` entries that come after ``(composite, member)`` in rank order."""
    out: list[Row] = []
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


# --- rank styles -------------------------------------------------------------------------------


def walk_ranks(
    style: RankStyle, signed: Sequence[int], first_ordinal: int, first_styled: int
) -> list[int]:
    """The ranks of consecutive entries (best first) with these signed scores, the first of
    which sits at position ``first_ordinal`` and has the style's rank ``first_styled``."""
    ranks: list[int] = []
    for i, value in enumerate(signed):
        if style == "ordinal":
            ranks.append(first_ordinal + i)
        elif i == 0:
            ranks.append(first_styled)
        elif value == signed[i - 1]:
            ranks.append(ranks[-1])
        elif style == "competition":
            ranks.append(first_ordinal + i)
        else:
            ranks.append(ranks[-1] + 1)
    return ranks


def queue_style_count(
    pipe: Pipeline, keys: Keys, view_key: str, period: Period, style: RankStyle, signed: int
) -> bool:
    """Queue the count that gives the style's rank of an entry with ``signed``; ``False`` (and
    nothing queued) for ordinal, whose rank is the position."""
    if style == "competition":
        pipe.zcount(view_key, (signed + 1) * ENCODINGS[period].scale, "+inf")
    elif style == "dense":
        pipe.zcount(keys.distinct(view_key), signed + 1, "+inf")
    else:
        return False
    return True


def _local_ranks(style: RankStyle, view: View, rows: Sequence[Row]) -> list[int]:
    """Ranks of a whole ranking held here (a friends scope)."""
    return walk_ranks(style, [view.signed(c) for _, c in rows], 1, 1)


def _entry(view: View, member: str, composite: float, rank: int, name: Any) -> dict[str, Any]:
    if view.kind == "teams":
        return {"rank": rank, "team_id": member, "score": view.score(composite)}
    return {"rank": rank, "user_id": member, "score": view.score(composite), "display_name": name}


def _queue_extras(
    pipe: Pipeline, keys: Keys, view: View, rows: Sequence[Row], style: RankStyle
) -> None:
    """Queue what turns rows into entries: the display names, the first row's style count."""
    if not rows:
        return
    if view.kind != "teams":
        pipe.hmget(keys.names(view.board.board_id), [m for m, _ in rows])
    queue_style_count(pipe, keys, view.key, view.period, style, view.signed(rows[0][1]))


def _entries(
    view: View, rows: Sequence[Row], first_ordinal: int, style: RankStyle, replies: Iterator[Any]
) -> list[dict[str, Any]]:
    """Entries of rows from the replies :func:`_queue_extras` queued, in the same order."""
    if not rows:
        return []
    names: list[Any] = next(replies) if view.kind != "teams" else [None] * len(rows)
    first_styled = first_ordinal if style == "ordinal" else 1 + int(next(replies))
    ranks = walk_ranks(style, [view.signed(c) for _, c in rows], first_ordinal, first_styled)
    return [
        _entry(view, m, c, rank, name)
        for (m, c), rank, name in zip(rows, ranks, names, strict=True)
    ]


# --- friends -----------------------------------------------------------------------------------


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


async def _friends_page(
    redis: Redis, keys: Keys, view: View, limit: int, cursor: str | None, style: RankStyle
) -> dict[str, Any]:
    rows, names = await friends_rows(redis, keys, view)
    start = 0
    if cursor is not None:
        after = decode_cursor(cursor)
        start = next((i for i, (m, c) in enumerate(rows) if (c, m) < after), len(rows))
    ranks = _local_ranks(style, view, rows)
    chosen = rows[start : start + limit]
    more = start + limit < len(rows)
    return {
        "total": len(rows),
        "entries": [
            _entry(view, m, c, ranks[start + i], names.get(m)) for i, (m, c) in enumerate(chosen)
        ],
        "next_cursor": encode_cursor(chosen[-1][1], chosen[-1][0]) if more and chosen else None,
    }


# --- the reads ---------------------------------------------------------------------------------


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
        composite, member = decode_cursor(cursor)
        rows = await _after_cursor(redis, view.key, composite, member, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zcard(view.key)
        if cursor is not None and rows:
            pipe.zrevrank(view.key, rows[0][0])
        _queue_extras(pipe, keys, view, rows, style)
        replies = iter(await pipe.execute())
    total = int(next(replies))
    first_rank = 1
    if cursor is not None and rows:
        found = next(replies)
        first_rank = int(found or 0) + 1
    entries = _entries(view, rows, first_rank, style, replies)
    next_cursor = encode_cursor(rows[-1][1], rows[-1][0]) if more and rows else None
    return {"total": total, "entries": entries, "next_cursor": next_cursor}


def _standing_body(
    user_id: str, rank: int, composite: float, position: int, total: int, view: View
) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "rank": rank,
        "score": view.score(composite),
        "total": total,
        # The share of the board at or below the user's position, in percent.
        "percentile": round(100.0 * (total - position + 1) / total, 2),
    }


async def standing(
    redis: Redis,
    keys: Keys,
    view: View,
    user_id: str,
    around: int,
    style: RankStyle = "ordinal",
) -> dict[str, Any]:
    """A user's rank, score and neighbours in one view; 404 if it has no score there."""
    if view.kind == "teams":
        raise Invalid(
            "The standing read takes a user; a team's place is in the teams leaderboard and in "
            "the user's ranks.",
            loc=("query", "scope"),
        )
    if view.kind == "friends":
        rows, names = await friends_rows(redis, keys, view)
        at = next((i for i, (m, _) in enumerate(rows) if m == user_id), None)
        if at is None:
            raise NotFound(f"User {user_id!r} has no score among these friends.")
        ranks = _local_ranks(style, view, rows)
        start = max(at - around, 0)
        return {
            **_standing_body(user_id, ranks[at], rows[at][1], at + 1, len(rows), view),
            "around": [
                _entry(view, m, c, ranks[start + i], names.get(m))
                for i, (m, c) in enumerate(rows[start : at + around + 1])
            ],
        }
    # One round trip: position, score, size, the entries around and their names.
    found: list[Any] = await redis.execute_command(  # type: ignore[no-untyped-call]
        "FCALL_RO",
        STANDING_FUNCTION,
        2,
        view.key,
        keys.names(view.board.board_id),
        user_id,
        around,
    )
    if not found:
        raise NotFound(f"User {user_id!r} has no score in this view.")
    rank0, composite, total = int(found[0]), float(found[1]), int(found[2])
    flat = found[3]
    rows = [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]
    start = max(rank0 - around, 0)
    # Competition and dense ranks take a second: the counts above the user and the first entry.
    counts: list[Any] = []
    if style != "ordinal":
        async with redis.pipeline(transaction=False) as pipe:
            for signed in (view.signed(composite), view.signed(rows[0][1])):
                queue_style_count(pipe, keys, view.key, view.period, style, signed)
            counts = await pipe.execute()
    rank = 1 + int(counts[0]) if counts else rank0 + 1
    extras = iter([found[4], *counts[1:]])
    return {
        **_standing_body(user_id, rank, composite, rank0 + 1, total, view),
        "around": _entries(view, rows, start + 1, style, extras),
    }
