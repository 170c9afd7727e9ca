"""The global view: recomputed from the regional boards, never from message deltas.

Consumed events only mark ``(period, period_id, region, user)`` dirty. Every
``LADDER_MERGE_INTERVAL`` the merger renames the dirty set to a "merging" set (a crash mid-merge
leaves it to be merged again) and sends its users, a chunk a call, to a Redis function
(``ladder_merge_v6``, shared/lua/merge.lua). It reads each user's current record in each region
they played in (their field of the board's users' regions hash, and their marks: the cost follows
the users and their regions, not the board's count of regions), writes the global entry and takes
the user's marks out of the merging set in one step (:mod:`services.aggregator.combine` says what
that entry is, and is the reference the tests hold the function to). An entry carries its
metadata along (shared/ranking.py).

A pass is bounded (``budget``): what it leaves stays in the merging set, so that a backlog drains
while the live views keep their cadence (main.py runs them apart), and each pass of a backlog first
merges a round of the marks made since, so that fresh scores do not wait behind it. Reading
current state, lost, late, doubled or reordered messages cannot skew it. After each pass every
touched view whose top 10 changed is pushed to ``leaderboard`` subscribers, and the users whose
global entry crossed a bracket of the global scope get ``rank`` messages
(:mod:`services.aggregator.global_brackets`); what of those does not go out is pushed again
before the board's next pass (:mod:`services.aggregator.pass_pushes`).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import structlog
from prometheus_client import Counter, Histogram
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from services.aggregator.fresh import FreshRegions
from services.aggregator.marks import GLOBAL, REGION, buildable, by_user, call_head, in_runs
from services.aggregator.pass_pushes import PassPushes, Touched
from shared.boards import Board
from shared.events import rfc3339
from shared.functions import DENSE_BUILD_FUNCTION, MERGE_FUNCTION, MERGE_TAKE_FUNCTION
from shared.keys import Keys
from shared.lease import Lease, LeaseLost, lost
from shared.periods import Period
from shared.submit import board_period_expiry

log = structlog.get_logger(__name__)

MERGED = Counter("ladder_aggregator_merged_users_total", "User entries merged into global")
MERGE_SECONDS = Histogram("ladder_aggregator_merge_seconds", "Time of one board's merge")

# Users a merge call takes: 1 to 3 ms of Redis under load, when every other client waits. Calls
# of 250 held Redis 7.5 ms at the median (docs/architecture.md, "Latency": with the derive and
# live calls as large, the POSTs' p99 at 435 a second was 26 to 30 ms, against 16 now).
CHUNK = 60
# Merge calls sent before the first of them is answered. Two keep Redis busy while this process
# works between calls; each is a call of its own, so others' commands still run between them.
IN_FLIGHT = 2
# ... while a batch of more than a round drains: 13 % faster on a backlog of 800,000 marks, for
# writes waiting behind up to four calls (about 2 ms of Redis) where two make them wait 1 ms.
IN_FLIGHT_BACKLOG = 4
# Marks a round takes from the merging set. Its calls are never pipelined on one connection:
# Redis runs a client's pipelined commands back to back, so a pipeline of calls would make others
# wait for all of them (a backlog's pipelines of 5,000 users held pushes back by 50 to 150 ms).
ROUND = 5000
# Members a step of a dense build takes (ladder_dense_build_v2): about a millisecond of Redis.
BUILD_STEP = 2000


@dataclass(slots=True)
class Pass:
    """One bounded pass of a board's merge."""

    board: Board
    written: int = 0
    periods: dict[tuple[Period, str], Touched] = field(default_factory=dict)

    def touched(self, period: Period, period_id: str) -> Touched:
        return self.periods.setdefault((period, period_id), Touched())


class Merger:
    """Merges boards' dirty users into their global views, a bounded pass at a time."""

    def __init__(self, redis: Redis, keys: Keys, lease: Lease | None = None) -> None:
        self._redis = redis
        self._keys = keys
        # A board is merged by one aggregator at a time (lease.py); by default the lease lasts
        # three of LADDER_MERGE_INTERVAL's default 2 s.
        self.lease = lease or Lease(redis, keys, ttl=6.0)
        self._pushes = PassPushes(redis, keys)
        # Periods each board's current batch has merged so far: their ``as_of`` moves when the
        # batch is drained (lost on a restart, it then says older, never newer, than the view).
        self._merged: dict[str, set[tuple[Period, str]]] = defaultdict(set)
        # Each board's batch (take count) and when it was taken, its as_of: a later mark waits for
        # the next batch. One this merger did not see taken (a restart before) moves no as_of.
        self._taken: dict[str, tuple[int, str]] = {}
        # Dense builds under way: (board, build set member) -> the cursor to go on from. A
        # member names a view within its board only ("alltime|all|global"): another board's
        # cursor would skip pairs of this one's view.
        self._building: dict[tuple[str, str], list[str]] = {}
        self.build_step = BUILD_STEP
        self.behind: set[str] = set()
        """Boards whose batch a pass left partway (its budget spent): more to merge now."""
        self._partway: set[str] = set()
        """Boards whose merging set a pass of this merger left partway, under its lease."""
        self._scans: dict[str, tuple[int, int]] = {}
        """Where the scan of each board's merging set stopped: the batch (its take count) and the
        cursor, which the batch's next pass goes on from (docs/architecture.md, "Staleness")."""

    async def with_work(self, boards: list[str]) -> tuple[set[str], set[str]]:
        """Those of ``boards`` with marks or a merging set, and those with dense builds asked
        for: one round trip for all (pipelined ``EXISTS``), the only cost of an idle board's
        pass. A board with neither is behind no more (another aggregator finished it)."""
        keys = self._keys
        async with self._redis.pipeline(transaction=False) as pipe:
            for bid in boards:
                pipe.exists(keys.dirty(bid), keys.dirty_merging(bid))
                pipe.exists(keys.dense_build(bid))
            found = await pipe.execute()
        merging = {bid for bid, n in zip(boards, found[::2], strict=True) if n}
        building = {bid for bid, n in zip(boards, found[1::2], strict=True) if n}
        self.behind &= merging | building
        self._partway &= merging
        # A batch or build of a board with none left (drained or finished elsewhere, or the
        # board deleted) is forgotten, so that nothing is kept of boards gone.
        self._scans = {bid: scan for bid, scan in self._scans.items() if bid in merging}
        self._taken = {bid: taken for bid, taken in self._taken.items() if bid in merging}
        self._merged = defaultdict(set, {b: p for b, p in self._merged.items() if b in merging})
        self._building = {at: c for at, c in self._building.items() if at[0] in building}
        self.lease.keep_only(boards)
        self._pushes.keep_only(set(boards))
        return merging, building

    async def merge_board(self, board: Board, budget: float | None = None) -> int:
        """Merge what is dirty of ``board``, for at most ``budget`` seconds (``None``: all of it);
        returns how many users were merged. What the budget leaves stays in the merging set, and
        the board's merge lease with this aggregator; once drained, the lease is given up. A board
        whose lease another aggregator holds is left to it (0)."""
        bid = board.board_id
        if not await self.lease.hold(bid):
            self.behind.discard(bid)
            return 0
        work = Pass(board)
        try:
            batch = await self._take_dirty(bid)
            if batch is None:
                self.behind.discard(bid)
                await self.lease.release(bid)
                return 0
            with MERGE_SECONDS.time():
                drained = await self._drain(work, budget, batch)
                await self._finish(work, drained, batch)
        except LeaseLost:
            log.warning("merge lease taken over; the board's pass stops", board_id=bid)
            # A lapsed lease no one took is this process's again, under a new token: given up.
            await self.lease.release(bid)
            self.behind.discard(bid)
            self._partway.discard(bid)
            self._merged.pop(bid, None)
            self._scans.pop(bid, None)
            self._taken.pop(bid, None)
        MERGED.inc(work.written)
        return work.written

    async def _take_dirty(self, bid: str) -> int | None:
        """Under the lease: the dirty set renamed to the merging set, unless one waits already;
        the batch in the merging set (its take count), or ``None`` with nothing to merge."""
        keys = self._keys
        lease_keys = [keys.merge_lease(bid), keys.dirty(bid), keys.dirty_merging(bid)]
        lease_keys.append(keys.merge_takes(bid))
        taken_at = rfc3339(datetime.now(UTC))
        # The count before the take, read under the lease (no other merger takes meanwhile).
        counted = int(await self._redis.get(keys.merge_takes(bid)) or 0)
        found, batch = await self._call(MERGE_TAKE_FUNCTION, lease_keys, self.lease.token(bid))
        if int(batch) > counted:
            self._taken[bid] = (int(batch), taken_at)
        return int(batch) if found else None

    async def _drain(self, work: Pass, budget: float | None, batch: int) -> bool:
        """Rounds of the merging set (``batch``) until it is drained (``True``) or ``budget`` is
        spent, the scan going on from where the last pass of the batch left it; the lease is
        renewed before each round after the first. Marks only leave a merging set, so a scan
        that comes back to cursor 0 has returned every mark it held: the set is empty."""
        bid = work.board.board_id
        merging = self._keys.dirty_merging(bid)
        deadline = None if budget is None else time.monotonic() + budget
        if bid in self._partway:
            await self._fresh_round(work)
        scan = self._scans.pop(bid, None)
        cursor = scan[1] if scan is not None and scan[0] == batch else 0
        drained, first = False, True
        while not drained:
            if not first:
                await self.lease.renew(bid)
            first = False
            begun = cursor
            cursor, marks = await self._take(merging, cursor)
            drained = cursor == 0
            depth = IN_FLIGHT if drained and begun == 0 else IN_FLIGHT_BACKLOG
            await self._merge_round(work, merging, marks, depth)
            if deadline is not None and time.monotonic() >= deadline:
                break
        if not drained:
            self._scans[bid] = (batch, cursor)
        return drained

    async def _fresh_round(self, work: Pass) -> None:
        """While a backlog drains, a round of the marks made since it was taken, straight from
        the dirty set, before the backlog's rounds: a score posted now reaches the global view
        within a pass or two, not after the whole backlog (the merge reads current records, so
        a user merged here and again from the backlog gets the same entry twice)."""
        dirty = self._keys.dirty(work.board.board_id)
        _, marks = await self._take(dirty, 0)
        if marks:
            await self._merge_round(work, dirty, marks)

    async def _call(self, function: str, keys: list[str], *args: Any) -> Any:
        """``FCALL`` of a function that checks the merge lease; :class:`LeaseLost` if refused."""
        try:
            return await self._redis.fcall(function, len(keys), *keys, *args)
        except ResponseError as error:
            if lost(error):
                raise LeaseLost(keys[0]) from error
            raise

    async def push_fresh(self, board: Board, fresh: FreshRegions | None = None) -> int:
        """Before the board's pass: what earlier passes' pushes left (:meth:`PassPushes.again`),
        then the top-10 pushes of the regional views events changed (``fresh``)."""
        await self._pushes.again(board)
        return 0 if fresh is None else await fresh.push(self._redis, self._keys, board)

    async def build_dense(self, board: Board, budget: float | None = None) -> int:
        """Build the distinct-score sets that dense reads of ``board``'s global and regional
        views asked for (``{P:B}:dense:build``), a step a call, one call at a time, for at most
        ``budget`` seconds (``None``: until done), under the board's merge lease; returns how many
        views were finished. What the budget leaves goes on from its cursor at the next pass
        (from the top after a restart, or in another aggregator, which only adds pairs again: the
        merge, for a global view, and the derive step, for a regional one, keep the set being
        built up to date meanwhile)."""
        keys, bid = self._keys, board.board_id
        wanted = [str(item) for item in await self._redis.smembers(keys.dense_build(bid))]
        # A view never built (marks.buildable): its ask goes, or the board would be probed, held
        # and let go every pass for good (a period kept again is asked for by its next read).
        never = [item for item in wanted if not buildable(board, item)]
        if never:
            await self._redis.srem(keys.dense_build(bid), *never)
        if not (wanted := sorted(set(wanted) - set(never))) or not await self.lease.hold(bid):
            return 0
        deadline = None if budget is None else time.monotonic() + budget
        done = 0
        try:
            for item in wanted:
                period, period_id, scope = item.split("|", 2)
                if scope == GLOBAL:
                    view = keys.global_view(bid, period, period_id)
                else:
                    view = keys.region_view(bid, period, period_id, scope[len(REGION) :])
                if not await self._build_view(board, item, view, deadline):
                    self.behind.add(bid)
                    return done
                done += 1
        except LeaseLost:
            log.warning("merge lease taken over; the board's dense builds stop", board_id=bid)
            return done
        if bid not in self._partway:  # no merge pass left partway either
            self.behind.discard(bid)
            await self.lease.release(bid)
        return done

    async def _build_view(self, board: Board, item: str, view: str, deadline: float | None) -> bool:
        """Steps of one view's build until it is done (``True``) or past ``deadline``."""
        keys, bid = self._keys, board.board_id
        period, period_id, _ = item.split("|", 2)
        expiry = board_period_expiry(board, cast(Period, period), period_id)
        build_keys = [view, keys.distinct(view), keys.distinct_building(view)]
        build_keys += [keys.dense_build(bid), keys.merge_lease(bid)]
        token = self.lease.token(bid)
        cursor: list[str] = self._building.get((bid, item), ["", ""])
        while True:
            reply: Any = await self._call(
                DENSE_BUILD_FUNCTION, build_keys, expiry, item, *cursor, self.build_step, token
            )
            if not reply:
                self._building.pop((bid, item), None)
                return True
            cursor = [str(reply[0]), str(reply[1])]
            self._building[(bid, item)] = cursor
            if deadline is not None and time.monotonic() >= deadline:
                return False

    async def _take(self, marks_set: str, cursor: int) -> tuple[int, list[str]]:
        """About a round of marks from ``marks_set`` (the merging set, or the dirty set for a
        fresh round), and where the scan goes on (a mark the scan returns twice in a round is merged
        once, marks.by_user; in two rounds, twice, to the same result)."""
        marks: list[str] = []
        while True:
            cursor, found = await self._redis.sscan(marks_set, cursor, count=ROUND)
            marks += cast(list[str], found)  # decoded replies: str
            if cursor == 0 or len(marks) >= ROUND:
                return cursor, marks

    async def _merge_round(
        self, work: Pass, marks_set: str, marks: list[str], depth: int = IN_FLIGHT
    ) -> None:
        """Merge ``marks``, each out of ``marks_set`` as its user is merged, ``depth`` calls out."""
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
                touched.before = await self._pushes.brackets.standing(board, period, period_id)
                touched.read = True
            work.written += await self._merge_period(
                board, period, period_id, group, touched, marks_set, depth
            )
            self._merged[board.board_id].add((period, period_id))
        if foreign:
            await self._redis.srem(marks_set, *foreign)

    async def _finish(self, work: Pass, drained: bool, batch: int) -> None:
        """After a pass: ``as_of`` once drained, then brackets and top-10 pushes of what it
        changed, then the lease given up if drained. ``as_of`` first: a reader that sees the
        pass's entries should find the time it was merged by, not the one before (or none, on a
        period's first merge). A drained merging set is gone already: each merge call took its
        marks out."""
        board, bid = work.board, work.board.board_id
        if drained:
            self.behind.discard(bid)
            self._partway.discard(bid)
            periods = self._merged.pop(bid, set())
            taken = self._taken.pop(bid, None)
            if periods and taken is not None and taken[0] == batch:
                await self._redis.hset(
                    self._keys.as_of(bid), mapping={f"{p}:{pid}": taken[1] for p, pid in periods}
                )
        else:
            self.behind.add(bid)
            self._partway.add(bid)
        await self._pushes.after(board, work.periods)
        if drained:
            await self.lease.release(bid)

    async def _merge_period(
        self,
        board: Board,
        period: Period,
        period_id: str,
        marks: list[str],
        touched: Touched,
        marks_set: str,
        depth: int,
    ) -> int:
        """Merge the users of ``marks`` (of this period) in Redis, ``CHUNK`` marks a call,
        ``depth`` calls at a time, each call taking its marks out of ``marks_set``; notes in
        ``touched`` the regions the marks name; returns
        how many users were merged (a user whose marks two rounds of the scan share counts in
        each)."""
        token = self.lease.token(board.board_id)
        view_keys, head = call_head(self._keys, board, period, period_id, marks_set, token)
        merged = 0

        def took(reply: Any) -> None:
            nonlocal merged
            _, refused, users = reply
            merged += int(users)
            for user in refused:
                log.warning(
                    "global score out of range: held at its end", user_id=user, period=period
                )

        # ``depth`` calls at a time, each on a connection of its own: while Redis runs one, this
        # process packs the next and reads the last one's reply.
        calls: deque[asyncio.Task[Any]] = deque()
        try:
            for chunk in by_user(marks, CHUNK):
                args, regions = in_runs(chunk)
                # The regions the marks name, whose views' tops the pass pushes (the function's
                # reply does not list them: the caller has them already).
                touched.regions.update(regions)
                calls.append(
                    asyncio.create_task(self._call(MERGE_FUNCTION, view_keys, *head, *args))
                )
                if len(calls) >= depth:
                    took(await calls.popleft())
            while calls:
                took(await calls.popleft())
        finally:
            for call in calls:
                call.cancel()
        return merged
