"""The global view: recomputed from the regional boards, never from message deltas.

Consumed events only mark ``(period, period_id, region, user)`` dirty. Every
``LADDER_MERGE_INTERVAL`` the merger takes the dirty set (renamed to a "merging" set so that a
crash mid-merge leaves it to be merged again) and sends its users, a chunk a call, to a Redis
function (``ladder_merge_v3``, shared/lua/merge.lua) that reads each one's current record in
each region it played in (its regions set and its marks: the cost follows the users and their
regions, not the board's count of regions), writes the user's global entry and takes its marks
out of the merging set in the same step. :func:`combine` is the reference of that entry:

- ``incr``: the sum of the regional scores, reached when the latest of them was, with the
  metadata of that latest;
- ``best``: the best regional entry (best score, then subscore, reached earliest);
- ``set``: the latest regional entry.

An entry carries its metadata along (shared/ranking.py).

A pass is bounded (``budget``): what it leaves stays in the merging set for the next pass, so
that a backlog drains while the aggregator's live views keep their cadence (main.py runs them
apart). Because it reads current state, lost, late, doubled or reordered messages cannot skew
it: the next merge that sees the user makes the entry right. After each pass every touched view
whose top 10 changed is pushed to ``leaderboard`` subscribers, and the users whose global entry
changed and crossed a bracket of the global scope get ``rank`` messages
(:mod:`services.aggregator.global_brackets`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import structlog
from prometheus_client import Counter, Histogram
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.aggregator.fresh import FreshRegions
from services.aggregator.global_brackets import GlobalBrackets, Standing
from services.aggregator.marks import by_user
from shared.boards import Board
from shared.events import rfc3339
from shared.functions import DENSE_BUILD_FUNCTION, MERGE_FUNCTION
from shared.keys import Keys, dirty_member
from shared.periods import Period
from shared.ranking import (
    MAX_SCORE,
    id_of,
    metadata_of,
    reached_of,
    score_of,
    subscore_of,
    tie_key,
)
from shared.submit import board_period_expiry

log = structlog.get_logger(__name__)

MERGED = Counter("ladder_aggregator_merged_users_total", "User entries merged into global")
MERGE_SECONDS = Histogram("ladder_aggregator_merge_seconds", "Time of one board's merge")
PUSHES = Counter("ladder_aggregator_top_pushes_total", "Top-10 changes published")

# Users a merge call takes: one Redis function call, a few ms of Redis on a board of a million,
# during which every other client waits (a score write, a publish on the way to a push).
CHUNK = 250
# Marks a round takes from the merging set. Its calls go one at a time, each its own round trip:
# Redis runs a client's pipelined commands back to back, so a pipeline of calls would make others
# wait for all of them (a backlog's pipelines of 5,000 users held pushes back by 50 to 150 ms).
ROUND = 5000
TOP = 10
# The scope of the global view, as the dense marker names it (shared/keys.py ``dense``), and
# the start of a regional view's scope in the build set ("region:<region>").
GLOBAL = "global"
REGION = "region:"
# Members a step of a dense build takes (ladder_dense_build_v1): about a millisecond of Redis.
BUILD_STEP = 2000
# A key (or mark) of a placeholder id, split there, gives the Lua its two ends: shared/keys.py
# stays the only place that spells them. NUL is in no id.
_SLOT = "\0"


def _ends(template: str) -> tuple[str, str]:
    """The two ends of a key or mark built around ``_SLOT``."""
    prefix, suffix = template.split(_SLOT)
    return prefix, suffix


@dataclass(slots=True)
class Touched:
    """What one pass did to one period: the global top before it, who changed, in which
    regions."""

    before: Standing | None = None
    read: bool = False
    changed: set[str] = field(default_factory=set)
    regions: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Pass:
    """One bounded pass of a board's merge."""

    board: Board
    written: int = 0
    periods: dict[tuple[Period, str], Touched] = field(default_factory=dict)

    def touched(self, period: Period, period_id: str) -> Touched:
        return self.periods.setdefault((period, period_id), Touched())


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
    """Merges boards' dirty users into their global views, a bounded pass at a time."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._brackets = GlobalBrackets(redis, keys)
        # Periods each board's current batch has merged so far: their ``as_of`` moves when the
        # batch is drained (lost on a restart, it then says older, never newer, than the view).
        self._merged: dict[str, set[tuple[Period, str]]] = defaultdict(set)
        # Dense builds under way: build set member -> the cursor to go on from.
        self._building: dict[str, list[str]] = {}
        self.build_step = BUILD_STEP
        self.behind: set[str] = set()
        """Boards whose batch a pass left partway (its budget spent): more to merge now."""

    async def merge_board(self, board: Board, budget: float | None = None) -> int:
        """Merge what is dirty of ``board``, for at most ``budget`` seconds (``None``: all of it);
        returns how many users were merged. What the budget leaves stays in the merging set."""
        dirty, merging = self._keys.dirty(board.board_id), self._keys.dirty_merging(board.board_id)
        if not await self._redis.exists(merging):
            try:
                await self._redis.rename(dirty, merging)
            except ResponseError:
                self.behind.discard(board.board_id)
                return 0  # nothing dirty
        with MERGE_SECONDS.time():
            deadline = None if budget is None else time.monotonic() + budget
            work = Pass(board)
            cursor, drained = 0, False
            while not drained:
                cursor, marks = await self._take(merging, cursor)
                drained = cursor == 0
                await self._merge_round(work, merging, marks)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            await self._finish(work, drained)
        MERGED.inc(work.written)
        return work.written

    async def push_fresh(self, board: Board, fresh: FreshRegions) -> int:
        """The top-10 pushes of the regional views that events changed since the last call
        (``fresh``), whatever the merge has yet to do; returns how many views were looked at."""
        views = fresh.take(board.board_id)
        by_period: dict[tuple[Period, str], list[str]] = defaultdict(list)
        for period, period_id, region in views:
            if period in board.periods:
                by_period[(period, period_id)].append(f"region:{region}")
        for (period, period_id), scopes in by_period.items():
            await self._push_tops(board, period, period_id, sorted(scopes))
        return len(views)

    async def build_dense(self, board: Board, budget: float | None = None) -> int:
        """Build the distinct-score sets that dense reads of ``board``'s global and regional
        views asked for (``{P:B}:dense:build``), a step a call, one call at a time, for at most
        ``budget`` seconds (``None``: until done); returns how many views were finished. What
        the budget leaves goes on from its cursor at the next pass (from the top after a
        restart, which only adds pairs again: the merge, for a global view, and the derive
        step, for a regional one, keep the set being built up to date meanwhile)."""
        keys, bid = self._keys, board.board_id
        wanted = [str(item) for item in await self._redis.smembers(keys.dense_build(bid))]
        deadline = None if budget is None else time.monotonic() + budget
        done = 0
        for item in sorted(wanted):
            period, period_id, scope = item.split("|", 2)
            if period not in board.periods:
                continue
            if scope == GLOBAL:
                view = keys.global_view(bid, period, period_id)
            elif scope.startswith(REGION):
                view = keys.region_view(bid, period, period_id, scope[len(REGION) :])
            else:
                continue  # a team board keeps its set always (the derive step's put_entry)
            expiry = board_period_expiry(board, period, period_id)
            build_keys = [view, keys.distinct(view), keys.distinct_building(view)]
            build_keys.append(keys.dense_build(bid))
            cursor: list[str] = self._building.get(item, ["", ""])
            while True:
                reply: Any = await self._redis.fcall(
                    DENSE_BUILD_FUNCTION, 4, *build_keys, expiry, item, *cursor, self.build_step
                )
                if not reply:
                    self._building.pop(item, None)
                    done += 1
                    break
                cursor = [str(reply[0]), str(reply[1])]
                self._building[item] = cursor
                if deadline is not None and time.monotonic() >= deadline:
                    self.behind.add(bid)
                    return done
        return done

    async def _take(self, merging: str, cursor: int) -> tuple[int, list[str]]:
        """About a round of marks from the merging set, and where the scan goes on (a mark the
        scan returns twice is merged twice, to the same result)."""
        marks: list[str] = []
        while True:
            cursor, found = await self._redis.sscan(merging, cursor, count=ROUND)
            marks += cast(list[str], found)  # decoded replies: str
            if cursor == 0 or len(marks) >= ROUND:
                return cursor, marks

    async def _merge_round(self, work: Pass, merging: str, marks: list[str]) -> None:
        board, foreign = work.board, []
        # The marks by period: what precedes a mark's region ("<period>|<period_id>|"); the
        # function takes them as they are.
        by_period: dict[str, list[str]] = defaultdict(list)
        for mark in marks:
            by_period[mark[: mark.index("|", mark.index("|") + 1) + 1]].append(mark)
        for head, group in by_period.items():
            period, period_id = head[:-1].split("|")
            if period not in board.periods:
                foreign += group  # a period the board no longer keeps: nothing to merge
                continue
            touched = work.touched(period, period_id)
            if not touched.read:  # the top before the pass's first write to the period
                touched.before = await self._brackets.standing(board, period, period_id)
                touched.read = True
            work.written += await self._merge_period(board, period, period_id, group, touched)
            self._merged[board.board_id].add((period, period_id))
        if foreign:
            await self._redis.srem(merging, *foreign)

    async def _finish(self, work: Pass, drained: bool) -> None:
        """After a pass: ``as_of`` once drained, then brackets and top-10 pushes of what it
        changed. ``as_of`` first: a reader that sees the pass's entries should find the time it
        was merged by, not the one before (or none, on a period's first merge)."""
        board, bid = work.board, work.board.board_id
        if drained:
            self.behind.discard(bid)
            await self._redis.delete(self._keys.dirty_merging(bid))
            periods = self._merged.pop(bid, set())
            if periods:
                now = rfc3339(datetime.now(UTC))
                await self._redis.hset(
                    self._keys.as_of(bid), mapping={f"{p}:{pid}": now for p, pid in periods}
                )
        else:
            self.behind.add(bid)
        for (period, period_id), touched in work.periods.items():
            await self._brackets.announce(board, period, period_id, touched.before, touched.changed)
            scopes = ["global", *(f"region:{r}" for r in sorted(touched.regions))]
            await self._push_tops(board, period, period_id, scopes)

    async def _merge_period(
        self, board: Board, period: Period, period_id: str, marks: list[str], touched: Touched
    ) -> int:
        """Merge the users of ``marks`` (of this period) in Redis, ``CHUNK`` marks a call, one
        call at a time; notes in ``touched`` the users whose global entry changed and the regions
        the marks name; returns how many users were merged (a user whose marks two rounds of the
        scan share counts in each)."""
        keys, bid = self._keys, board.board_id
        expiry = board_period_expiry(board, period, period_id)
        global_key = keys.global_view(bid, period, period_id)
        view_keys = [global_key, keys.distinct(global_key), keys.ties(global_key)]
        view_keys += [
            keys.dirty_merging(bid),
            keys.distinct_building(global_key),
            keys.dense(bid),
            keys.hidden(bid),
        ]
        head = [
            expiry or 0,
            board.operator,
            *_ends(keys.ties(keys.region_view(bid, period, period_id, _SLOT))),
            *_ends(keys.user_regions(bid, _SLOT)),
            *_ends(dirty_member(period, period_id, _SLOT, "")),
            GLOBAL,
        ]
        merged = 0
        for chunk in by_user(marks, CHUNK):
            reply: Any = await self._redis.fcall(
                MERGE_FUNCTION, len(view_keys), *view_keys, *head, *chunk
            )
            moved, refused, regions, users = reply
            touched.changed.update(moved)
            touched.regions.update(regions)
            merged += int(users)
            for user in refused:
                log.warning("global score out of range", user_id=user, period=period)
        return merged

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
        expiry = board_period_expiry(board, period, period_id) or None
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
