"""The live views of play in the aggregator: hot streaks and team MVPs (docs/api.md section 8a).

Consumed events are recorded in Redis, idempotently and with no regard to order:

- each on-time event of the last 60 s becomes one member of the board's hot set, named by its
  event id and user (an event id belongs to its board and user), and is added to the per-user
  sum and count of each window it is inside; one ``ladder_hot_add_v2`` call per board and up
  to ``HOT_ADD_STEP`` events of a batch does both, for each event whose member is new, so a
  redelivery adds nothing;
- each team event of an ``incr`` board adds its value to its member's contribution to the team
  in every period, once per event (``ladder_contribute_v4``, one call per board and up to
  ``CONTRIBUTE_STEP`` events of a batch: each event's mark in its record, shared/lua/live.lua,
  and the summed increments in one atomic step).

On the ticker (:meth:`LiveViews.tick`, a pass over every board) each window's start moves up to
the clock (``ladder_hot_trim_v2`` takes the events it leaves out of its sums, so a tick costs
what arrived and left since the last one plus one read per window of its users' sums), and the
MVPs of each current period whose contributions changed or that began since (or, at least
every ``FULL_PASS_SECONDS``, all of them). Each result is swapped into its view key with
``SET ... GET``; it is pushed only when its entries differ from those it replaced, so several
aggregators computing the same view push it once (and put back if its push fails, so the next
pass pushes it). A board with no hot event whose hot view was empty when last computed is left
as it is (one pipelined ``EXISTS`` a pass finds them), the pass's time stored for the API to
answer for them (``Keys.live_quiet``). State lives in Redis
only: a restarted aggregator carries on where the last one was (computing each board once
before it leaves the quiet ones alone).
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any, cast

import orjson
from prometheus_client import Counter
from redis.asyncio import Redis

from shared.boards import Board, BoardCatalog
from shared.events import ScoreAccepted, rfc3339
from shared.functions import CONTRIBUTE_FUNCTION, HOT_ADD_FUNCTION, HOT_TRIM_FUNCTION
from shared.keys import Keys, seen_keys
from shared.lease import Lease
from shared.live_maths import (
    HOT_SPAN_MS,
    HOT_WINDOWS,
    TOP,
    hot_entries,
    hot_member,
    hot_message,
    mvp_message,
    mvp_view,
)
from shared.live_maths import on_time as is_on_time
from shared.periods import Period
from shared.service import board_step
from shared.submit import board_period_expiry, current_window, expiry_of

PUSHES = Counter("ladder_aggregator_live_pushes_total", "Live view changes published", ["view"])
RECORDED = Counter(
    "ladder_aggregator_live_events_total", "Events recorded for the live views", ["view"]
)
for _view in ("hot", "mvps"):  # each series at 0 from the start
    PUSHES.labels(_view)
    RECORDED.labels(_view)

SEEN_TTL_SECONDS = 86_400
# Hot state nobody trims, and a hot view nobody recomputes (no aggregator running), disappear
# rather than go stale.
HOT_TTL_MS = 2 * HOT_SPAN_MS
HOT_VIEW_TTL_SECONDS = HOT_TTL_MS // 1000
FULL_PASS_SECONDS = 30.0
CALL_MEMO = 4096
# Events a call takes at most: 1 to 3 ms of Redis each under load (a backlog's batch of
# thousands in one call held every other client for a tenth of a second and more). The calls go
# one after another, each awaited, not in a pipeline that Redis would run back to back.
CONTRIBUTE_STEP = 15
HOT_ADD_STEP = 100
# Events a hot trim call takes out of each window, at most about: a few milliseconds of Redis.
TRIM_STEP = 100


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class RecordLive:
    """The consumer's part: record events for the hot and MVP views."""

    def __init__(self, redis: Redis, keys: Keys, catalog: BoardCatalog) -> None:
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        # A contribution's keys and expiries depend on its board, team and period ids only.
        self._calls: dict[
            tuple[str, str, tuple[tuple[Period, str], ...]],
            tuple[Board, tuple[str, ...], tuple[int, ...], frozenset[str]],
        ] = {}

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        horizon = _ms(datetime.now(UTC)) - HOT_SPAN_MS
        hot: dict[str, list[object]] = defaultdict(list)  # board -> hot_add's event arguments
        teams: dict[str, list[ScoreAccepted]] = defaultdict(list)  # board -> its team events
        boards: dict[str, Board | None] = {}  # looked up once a batch
        for event in events:
            occurred = _ms(event.occurred_at)
            if is_on_time(event) and occurred > horizon:
                hot[event.board_id] += [hot_member(event), occurred, event.user_id, event.value]
            if event.team_id is None:
                continue
            if event.board_id in boards:
                board = boards[event.board_id]
            else:
                board = boards[event.board_id] = await self._catalog.get(event.board_id)
            if board is not None and board.operator == "incr":
                teams[board.board_id].append(event)
        redis = self._redis
        for board_id, args in hot.items():
            window_keys = hot_keys(self._keys, board_id)
            for start in range(0, len(args), 4 * HOT_ADD_STEP):
                step = args[start : start + 4 * HOT_ADD_STEP]
                await redis.fcall(
                    HOT_ADD_FUNCTION, len(window_keys), *window_keys, HOT_TTL_MS, *step
                )
        for board_id, team_events in teams.items():
            board = boards[board_id]
            assert board is not None
            dirty: set[str] = set()
            for start in range(0, len(team_events), CONTRIBUTE_STEP):
                chunk = team_events[start : start + CONTRIBUTE_STEP]
                call_keys, call_args = self._contribution(board, chunk, dirty)
                await redis.fcall(CONTRIBUTE_FUNCTION, len(call_keys), *call_keys, *call_args)
            if dirty:
                await redis.sadd(self._keys.mvp_dirty(board_id), *dirty)
        RECORDED.labels("hot").inc(sum(len(args) // 4 for args in hot.values()))
        RECORDED.labels("mvps").inc(sum(len(team_events) for team_events in teams.values()))

    def _contribution(
        self, board: Board, events: list[ScoreAccepted], dirty: set[str]
    ) -> tuple[list[str], list[object]]:
        """``ladder_contribute_v4``'s keys and arguments for team ``events`` of ``board``; the
        periods they mark dirty are added to ``dirty``."""
        bid = board.board_id
        seen: list[str] = []
        event_args: list[object] = []
        groups: dict[tuple[str, tuple[tuple[Period, str], ...]], int] = {}
        group_keys: list[str] = []
        group_args: list[object] = []
        for event in events:
            team = cast(str, event.team_id)
            periods = tuple((period, result.period_id) for period, result in event.periods.items())
            group = groups.get((team, periods))
            if group is None:
                view_keys, expiries, marks = self._views_of(board, team, periods)
                group = groups[(team, periods)] = len(groups) + 1
                # Where the group's keys will start in KEYS, after every event's seen keys.
                group_args += [3 * len(events) + len(group_keys) + 1, len(expiries), *expiries]
                group_keys += view_keys
                dirty |= marks
            seen += seen_keys(self._keys, bid, "aggregator", event.event_id, event.user_id)
            event_args += [event.value, event.user_id, _ms(event.accepted_at), team, group]
        call_args = [SEEN_TTL_SECONDS, len(events), len(groups), *event_args, *group_args]
        return seen + group_keys, call_args

    def _views_of(
        self, board: Board, team: str, periods: tuple[tuple[Period, str], ...]
    ) -> tuple[tuple[str, ...], tuple[int, ...], frozenset[str]]:
        """:meth:`_call_of`, remembered for this very definition (the catalog hands out a new
        one when it re-reads it)."""
        memo = (board.board_id, team, periods)
        known = self._calls.get(memo)
        if known is None or known[0] is not board:
            if len(self._calls) >= CALL_MEMO:
                self._calls.clear()
            known = self._calls[memo] = (board, *self._call_of(board, team, periods))
        return known[1], known[2], known[3]

    def _call_of(
        self, board: Board, team: str, periods: tuple[tuple[Period, str], ...]
    ) -> tuple[tuple[str, ...], tuple[int, ...], frozenset[str]]:
        """The keys (but the seen keys), expiries and dirty marks of a contribution to ``team``
        in ``periods``: the same for every event of that team in those periods."""
        keys, bid = self._keys, board.board_id
        view_keys: list[str] = []
        expiries: list[int] = []
        dirty: set[str] = set()
        for period, period_id in periods:
            if period not in board.periods:
                continue
            view_keys += [
                keys.team_members(bid, period, period_id, team),
                keys.member_team(bid, period, period_id),
            ]
            expiries.append(board_period_expiry(board, period, period_id))
            dirty.add(f"{period}|{period_id}")
        return tuple(view_keys), tuple(expiries), frozenset(dirty)


def hot_keys(keys: Keys, board_id: str) -> list[str]:
    """The hot view's keys as its functions take them: the event set, then each window's hash
    and ranking."""
    windows = [(keys.hot_window(board_id, w), keys.hot_rank(board_id, w)) for w in HOT_WINDOWS]
    return [keys.hot_events(board_id), *(key for pair in windows for key in pair)]


class LiveViews:
    """The ticker's part: recompute the views of one board and push those that changed."""

    def __init__(self, redis: Redis, keys: Keys, lease: Lease | None = None) -> None:
        self._redis = redis
        self._keys = keys
        self._full_pass_at: dict[str, float] = {}
        # Each board period's id whose MVPs this process last stored (a new one: _rolled()).
        self._period_ids: dict[tuple[str, Period], str] = {}
        self._settled: set[str] = set()
        """Boards whose hot view this process last computed empty, or another aggregator
        holds (their live lease): looked at again when events come."""
        self.lease = lease or Lease(redis, keys, ttl=6.0, kind="live")
        """Whose a board's live views are (lease.py): with several aggregators, one computes
        them; an aggregator that died leaves them to another within the lease (6 s, three of
        LADDER_MERGE_INTERVAL's default)."""

    async def tick(self, boards: list[Board]) -> int:
        """Recompute the live views of ``boards``; returns how many were pushed. A board with no
        hot event (one pipelined ``EXISTS`` for all) whose hot view was empty when last computed
        is not computed again: its view is empty still, and ``Keys.live_quiet`` says as of when
        (the API reads it beside the stored view: shared/live_maths.py ``hot_current``); its MVPs
        are computed where contributions marked them, or when all are due. So an idle board costs
        the pass that round trip's share, not four calls of its own."""
        probed = rfc3339(datetime.now(UTC))
        self._keep_only({board.board_id for board in boards})
        async with self._redis.pipeline(transaction=False) as pipe:
            for board in boards:
                pipe.exists(self._keys.hot_events(board.board_id))
                pipe.exists(self._keys.mvp_dirty(board.board_id))
            found = await pipe.execute()
        pushed = 0
        for board, events, dirty in zip(boards, found[::2], found[1::2], strict=True):
            bid = board.board_id
            hot = events or bid not in self._settled
            # Only an incr board keeps MVPs: another's is never computed, and a mark left on it
            # (by an erasure of the version before) goes rather than stay for good.
            mvps = board.operator == "incr" and (
                dirty or self._full_due(bid) or self._rolled(board)
            )
            with board_step(board, "live views"):
                if dirty and board.operator != "incr":
                    await self._redis.delete(self._keys.mvp_dirty(bid))
                if (hot or mvps) and not await self.lease.hold(bid):
                    # Another aggregator's: this one looks again when events come, or at the
                    # next full pass of MVPs (in case that one is gone).
                    self._settled.add(bid)
                    self._full_pass_at[bid] = time.monotonic()
                    self._rolled(board, note=True)
                    continue
                if hot:
                    pushed += await self.hot(board)
                if mvps:
                    pushed += await self.mvps(board)
        # After the views of boards with events are stored: a reader who sees this time finds
        # them as of it or later.
        await self._redis.set(self._keys.live_quiet(), probed, ex=HOT_VIEW_TTL_SECONDS)
        return pushed

    def _keep_only(self, board_ids: set[str]) -> None:
        """What this process keeps of each board, for the boards defined now only: a deleted
        board's would stay for the life of the process."""
        self._settled &= board_ids
        self._full_pass_at = {b: at for b, at in self._full_pass_at.items() if b in board_ids}
        self._period_ids = {k: p for k, p in self._period_ids.items() if k[0] in board_ids}
        self.lease.keep_only(board_ids)

    def _rolled(self, board: Board, *, note: bool = False) -> bool:
        """Whether a period of the board began since this process stored its MVPs; ``note``:
        take the current ones as stored (a board another aggregator computes)."""
        now, rolled = datetime.now(UTC), False
        for period in board.periods:
            found = current_window(period, now, board.timezone, board.schedule).period_id
            rolled |= self._period_ids.get((board.board_id, period)) != found
            if note:
                self._period_ids[board.board_id, period] = found
        return rolled

    async def tick_board(self, board: Board) -> int:
        """Recompute ``board``'s live views; returns how many were pushed."""
        return await self.hot(board) + await self.mvps(board)

    async def hot(self, board: Board, now: datetime | None = None) -> int:
        now = now or datetime.now(UTC)
        now_ms, keys, bid = _ms(now), self._keys, board.board_id
        starts = [now_ms - w * 1000 for w in HOT_WINDOWS]
        call_keys = [*hot_keys(keys, bid), keys.hidden(bid)]
        # Calls of a bounded cost each, so that a window many events leave at once (a burst of
        # play a minute ago) does not hold Redis for the whole of them; the last returns the tops.
        while True:
            reply: list[Any] = await self._redis.fcall(
                HOT_TRIM_FUNCTION, len(call_keys), *call_keys, HOT_TTL_MS, TRIM_STEP, TOP, *starts
            )
            if int(reply[0]):
                break
        pushed = 0
        tops = reply[1:]
        # Settled only once its views are stored and pushed: one whose push failed is computed
        # again by the next pass, events or not.
        self._settled.discard(bid)
        for window, top in zip(HOT_WINDOWS, tops, strict=True):
            message = hot_message(bid, window, rfc3339(now), hot_entries(top))
            channel = self._keys.board_channel(board.board_id, "hot", str(window))
            key = self._keys.hot_view(board.board_id, window)
            pushed += await self._swap(key, channel, message, HOT_VIEW_TTL_SECONDS, None)
        if not any(tops):
            self._settled.add(bid)
        PUSHES.labels("hot").inc(pushed)
        return pushed

    async def mvps(self, board: Board, now: datetime | None = None) -> int:
        if board.operator != "incr":
            return 0
        keys, bid = self._keys, board.board_id
        now = now or datetime.now(UTC)
        full = self._full_due(bid)
        dirty: set[Any] = await self._redis.smembers(keys.mvp_dirty(bid))
        if dirty:
            # Taken before computing: a contribution recorded meanwhile marks it again.
            await self._redis.srem(keys.mvp_dirty(bid), *dirty)
        try:
            pushed = await self._mvps(board, now, full, dirty)
        except Exception:
            # A view whose push failed is stored as it was before (:meth:`_swap`); marked again,
            # it is computed and pushed by the next pass (and a full pass that failed is due
            # still).
            if dirty:
                await self._redis.sadd(keys.mvp_dirty(bid), *dirty)
            raise
        if full:
            self._full_pass_at[bid] = time.monotonic()
        PUSHES.labels("mvps").inc(pushed)
        return pushed

    async def _mvps(self, board: Board, now: datetime, full: bool, dirty: set[Any]) -> int:
        """Compute and push the MVPs of ``board``'s current periods (``full``: all of them, else
        those ``dirty`` names or begun since this process stored them); how many were pushed."""
        keys, bid = self._keys, board.board_id
        pushed = 0
        for period in board.periods:
            window = current_window(period, now, board.timezone, board.schedule)
            rolled = self._period_ids.get((bid, period)) != window.period_id
            if not full and not rolled and f"{period}|{window.period_id}" not in dirty:
                continue
            as_of, entries = await mvp_view(self._redis, keys, board, period, window.period_id)
            message = mvp_message(bid, period, window.period_id, as_of, entries)
            # Cached: a season's expiry walks its schedule (croniter) once a period kept, and
            # the first pass after a start computes every board's views.
            retention = board.retention.of(period)
            expiry = expiry_of(window, board.timezone, retention, board.schedule) or None
            channel = keys.board_channel(bid, "mvps", period)
            pushed += await self._swap(keys.mvp_view(bid, period), channel, message, None, expiry)
            self._period_ids[bid, period] = window.period_id
        return pushed

    def _full_due(self, board_id: str) -> bool:
        """Whether the board's MVPs are due to be computed all (every ``FULL_PASS_SECONDS``)."""
        since = time.monotonic() - self._full_pass_at.get(board_id, float("-inf"))
        return since >= FULL_PASS_SECONDS

    async def _swap(
        self,
        key: str,
        channel: str,
        message: dict[str, Any],
        ttl: int | None,
        expire_at_s: int | None,
    ) -> int:
        """Store ``message`` as the view's current state; publish it if its content changed.

        If the publish fails (on Redis Cluster the channel's slot is not the board's: its
        primary may be failing over while the board's answers), the view is put back as it was
        before, so that the next pass finds the content changed and publishes it; a newer view
        stored meanwhile by another aggregator is overwritten too, which only repeats a push."""
        body = orjson.dumps(message)
        old: Any = await self._redis.set(key, body, ex=ttl, exat=expire_at_s, get=True)
        previous = orjson.loads(old) if old is not None else {}
        if _content(previous) == _content(message):
            return 0
        try:
            await self._redis.publish(channel, body)
        except Exception:
            if old is None:
                await self._redis.delete(key)
            else:
                await self._redis.set(key, old, ex=ttl, exat=expire_at_s)
            raise
        return 1


def _content(message: dict[str, Any]) -> tuple[Any, ...]:
    """What a push is about: the period it names and its entries (not the time it was made)."""
    return message.get("period_id"), message.get("entries", [])
