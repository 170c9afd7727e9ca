"""The global view: recomputed from the regional boards, never from message deltas.

Consumed events only mark ``(period, period_id, region, user)`` dirty. Every
``LADDER_MERGE_INTERVAL`` the merger takes the dirty set (renamed to a "merging" set so that a
crash mid-merge leaves it to be merged again), reads each dirty user's current score in every
region of that period, and writes the user's global entry:

- ``incr``: the sum of the regional scores, reached when the latest of them was, with the
  metadata of that latest;
- ``best``: the best regional entry (best score, then subscore, reached earliest);
- ``set``: the latest regional entry.

An entry carries its metadata along (shared/ranking.py).

Because it reads current state, lost, late, doubled or reordered messages cannot skew it: the
next merge that sees the user makes the entry right. Then every touched view whose top 10
changed is pushed to ``leaderboard`` subscribers, and the users who crossed a bracket of the global
scope get ``rank`` messages (:mod:`services.aggregator.global_brackets`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog
from prometheus_client import Counter, Histogram
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.aggregator.global_brackets import GlobalBrackets
from shared.boards import Board
from shared.events import rfc3339
from shared.functions import PUT_FUNCTION
from shared.keys import Keys, parse_dirty_member
from shared.periods import Period, expire_at, window_of
from shared.ranking import (
    MAX_SCORE,
    id_of,
    metadata_of,
    parse_record,
    reached_of,
    score_of,
    subscore_of,
    tie_key,
)

log = structlog.get_logger(__name__)

MERGED = Counter("ladder_aggregator_merged_users_total", "User entries merged into global")
MERGE_SECONDS = Histogram("ladder_aggregator_merge_seconds", "Time of one board's merge")
PUSHES = Counter("ladder_aggregator_top_pushes_total", "Top-10 changes published")

CHUNK = 500
TOP = 10


@dataclass(frozen=True, slots=True)
class Touched:
    users: set[str]
    regions: set[str]


# A regional or global entry: its signed score (shared/ranking.py), tie key and metadata.
Entry = tuple[int, str, str]


def combine(operator: str, entries: list[Entry]) -> Entry | None:
    """A user's global entry from its regional ones (at least one); ``None`` if out of range."""
    if len(entries) == 1:
        return entries[0]
    if operator == "best":
        # The best score, then subscore, then the earliest reached: the greatest in rank order.
        return max(entries, key=lambda entry: entry[:2])
    reached = [reached_of(tie) for _, tie, _ in entries]
    latest = reached.index(max(reached))
    if operator == "set":
        return entries[latest]
    total = sum(signed for signed, _, _ in entries)
    if abs(total) > MAX_SCORE:
        return None
    return total, tie_key(reached[latest]), entries[latest][2]


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


class Merger:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._brackets = GlobalBrackets(redis, keys)

    async def merge_board(self, board: Board) -> int:
        """Merge everything dirty of ``board``; returns how many user entries were written."""
        dirty, merging = self._keys.dirty(board.board_id), self._keys.dirty_merging(board.board_id)
        if not await self._redis.exists(merging):
            try:
                await self._redis.rename(dirty, merging)
            except ResponseError:
                return 0  # nothing dirty
        with MERGE_SECONDS.time():
            touched: dict[tuple[Period, str], Touched] = defaultdict(lambda: Touched(set(), set()))
            async for member in self._redis.sscan_iter(merging, count=1000):
                period, period_id, region, user_id = parse_dirty_member(member)
                if period not in board.periods:
                    continue
                entry = touched[(period, period_id)]
                entry.users.add(user_id)
                entry.regions.add(region)
            written = 0
            for (period, period_id), entry in touched.items():
                before = await self._brackets.standing(board, period, period_id)
                written += await self._merge_period(board, period, period_id, entry.users)
                await self._brackets.announce(board, period, period_id, before, entry.users)
                scopes = ["global", *(f"region:{r}" for r in sorted(entry.regions))]
                await self._push_tops(board, period, period_id, scopes)
            await self._redis.delete(merging)
        MERGED.inc(written)
        return written

    async def _merge_period(
        self, board: Board, period: Period, period_id: str, users: set[str]
    ) -> int:
        keys, bid = self._keys, board.board_id
        members: set[Any] = await self._redis.smembers(keys.regions(bid, period, period_id))
        regions: list[str] = sorted(members)
        window = window_of(period, period_id, board.timezone)
        expiry = expire_at(window, board.timezone, board.retention.of(period))
        global_key = keys.global_view(bid, period, period_id)
        ordered = sorted(users)
        for start in range(0, len(ordered), CHUNK):
            chunk = ordered[start : start + CHUNK]
            async with self._redis.pipeline(transaction=False) as pipe:
                for region in regions:
                    view = keys.region_view(bid, period, period_id, region)
                    pipe.hmget(keys.ties(view), chunk)
                per_region: list[list[Any]] = await pipe.execute() if regions else []
            fours: list[str | int] = []
            absent: list[str] = []
            for i, user in enumerate(chunk):
                # The user's entries, one a region: its record at i of each region's reply.
                records = [parse_record(found[i]) for found in per_region if found[i] is not None]
                entries = [(signed, tie, meta) for tie, signed, meta in records]
                merged = combine(board.operator, entries) if entries else None
                if merged is None:
                    if entries:
                        log.warning("global score out of range", user_id=user, period=period)
                    absent.append(user)
                else:
                    fours += [user, *merged]
            for user in absent:
                fours += [user, "", "", ""]
            view_keys = [global_key, keys.distinct(global_key), keys.ties(global_key)]
            await self._redis.fcall(PUT_FUNCTION, len(view_keys), *view_keys, expiry or 0, *fours)
        await self._redis.hset(keys.as_of(bid), f"{period}:{period_id}", rfc3339(datetime.now(UTC)))
        return len(ordered)

    async def _push_tops(
        self, board: Board, period: Period, period_id: str, scopes: list[str]
    ) -> None:
        keys, bid = self._keys, board.board_id
        async with self._redis.pipeline(transaction=False) as pipe:
            for scope in scopes:
                pipe.zrevrange(keys.board_view(bid, period, period_id, scope), 0, TOP - 1, True)
                pipe.get(keys.last_top(bid, period, period_id, scope))
            replies = await pipe.execute()
        members = {id_of(m) for rows in replies[0::2] for m, _ in rows}
        # The tops' display names and records (their metadata), in one round trip.
        async with self._redis.pipeline(transaction=False) as pipe:
            if members:
                pipe.hmget(keys.names(bid), list(members))
            for scope, rows in zip(scopes, replies[0::2], strict=True):
                if rows:
                    view = keys.board_view(bid, period, period_id, scope)
                    pipe.hmget(keys.ties(view), [id_of(m) for m, _ in rows])
            found = await pipe.execute()
        names: dict[str, str | None] = (
            dict(zip(members, found.pop(0), strict=True)) if members else {}
        )
        held = iter(found)
        records: list[list[Any]] = [next(held) if rows else [] for rows in replies[0::2]]
        window = window_of(period, period_id, board.timezone)
        expiry = expire_at(window, board.timezone, board.retention.of(period))
        changed = 0
        async with self._redis.pipeline(transaction=False) as pipe:
            # Every changed scope's swap and push in one round trip.
            for scope, rows, last, kept in zip(
                scopes, replies[0::2], replies[1::2], records, strict=True
            ):
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
                pipe.set(keys.last_top(bid, period, period_id, scope), fingerprint)
                if expiry is not None:
                    pipe.expireat(keys.last_top(bid, period, period_id, scope), expiry)
                pipe.publish(keys.board_channel(bid, scope, period), orjson.dumps(message))
                changed += 1
            if changed:
                await pipe.execute()
        PUSHES.inc(changed)
