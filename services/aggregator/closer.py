"""Period ends: one ``period.closed`` message per period of a board (docs/api.md 8b).

Every ``CLOSE_TICK`` seconds the aggregator looks at each board's periods (daily, weekly,
monthly, season; all-time never ends). A period is due once its end plus
``LADDER_ALLOWED_LATENESS`` plus a grace (``LADDER_MERGE_INTERVAL`` + ``CLOSE_GRACE``, both in
``LadderSettings.close_delay``) has passed: from then on the API refuses every event that
would fall in it (older than the lateness), so its regional boards, which the write keeps in the
same step as it answers, are final. Its close then goes in three steps, each taken again on the
next tick if this one did not get there (a restart, an error, another aggregator):

1. **Last merge.** Every user of each of the period's regional boards (the declared regions and
   the period's regions set, which the write fills) is marked dirty for the merge (once:
   ``Keys.period_closing``), so that the global board is recomputed from the final regional
   ones, whether or not the events' messages reached the aggregator (a broker down).
2. **Drained.** The close waits until the merge has drained a batch of marks it took after
   step 1 (the board's take counter, ``Keys.merge_takes``, past the count step 1 noted), or
   until no mark waits at all: every mark of the period was in that batch or an earlier one,
   so the global board is then exactly the merge of the final regional boards. (A mark that a
   late message adds after step 1 merges a final regional record again: it changes nothing.)
   On an ``incr`` board it also waits until the derive step has applied the event the board
   accepted last when step 1 ran (noted with the count), so that the team boards, which the
   derive step sums, hold every event of the period; for ``DERIVE_WAIT`` at most.
3. **Claim.** The top ``LADDER_SNAPSHOT_SIZE`` of every scope (global, each region, teams on
   ``incr`` boards) is read and handed to the close function (shared/lua/periods.lua), which
   sets the period's claim with ``SET NX``, and only if it was not set appends the
   ``period.closed`` message to the board's period outbox and publishes ``period_closed`` on
   the board's channels that the API forwards to WebSocket subscribers (top 10 of each scope),
   all in one atomic step under the board's hash tag. A second aggregator, or one restarted
   after the claim, finds the claim set and does nothing. The outbox keeps the newest
   ``LADDER_PERIODS_OUTBOX_MAX`` messages: while none goes out (no queue bound to
   ``ladder.periods``, the broker away) a close past it drops the oldest, counted
   (``ladder_periods_dropped_total``) and logged.

The steps that write (the marks and the claim) look first that the board is still defined, and
the marks look again before their marker and watermark are set: a close that went on after a
deletion's last pass left the deleted board's claim, marker and message to a board made later
under the name. (Marks left so are harmless: the merge reads the records as they stand.)

A period's claim, its close marker and its message's ``message_id`` are named by
:func:`shared.periods.close_name`: the period id, and for a season its end as well, since a
changed schedule may start a season whose id a closed season of the schedule before had (the
same minute, another length); named by the id alone, it would find that season's claim and never
be announced. The version before named a season's claim and marker by the id alone. Its marker
is not looked for (a season it marked is marked again: a merge of final records more). Its claim
is not looked for either: it moved the watermark to the season's end in the same step, and the
close function refuses a period that ends at or before its kind's watermark, so a season it
claimed is not claimed again under the new name, even by a close that began before its claim.

:class:`services.aggregator.period_relay.PeriodRelay` takes the message from the outbox to the
``ladder.periods`` exchange with publisher confirms. A period in which nobody scored closes
without a message (its claim and watermark are still set). After a restart the periods that
ended since the latest one closed (``Keys.period_watermark``) are closed, within their
retention; a board closing a kind of period for the first time closes only the latest one, and
every one after it (its marks set the watermark to its start).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis

from services.aggregator.final_tops import announced, final_tops
from services.aggregator.period_relay import DROPPED
from shared.boards import Board, BoardCatalog
from shared.derived import underived
from shared.events import rfc3339
from shared.functions import CLOSE_PERIOD_FUNCTION
from shared.keys import Keys, dirty_member
from shared.periods import (
    PeriodRangeError,
    PeriodWindow,
    close_name,
    previous_window,
    window_at,
    windows_before,
)
from shared.ranking import id_of
from shared.service import board_step
from shared.settings import CLOSE_GRACE
from shared.submit import board_period_expiry

log = structlog.get_logger(__name__)

CLOSED = Counter("ladder_periods_closed_total", "Periods closed (claimed) by this process")

CLOSE_TICK = 1.0
# Markers of a close (closing, closed) live at least this long from the close, whatever the
# period's own expiry: one already past would drop the marker as it is set.
MARK_FLOOR = 3600
MARK_CHUNK = 1000
# Seconds an incr board's close waits for the derive step (the teams scope) from its marks.
DERIVE_WAIT = 60.0


class Closer:
    """Closes the periods of each board (see the module docstring)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        *,
        lateness: float,
        merge_interval: float,
        size: int,
        outbox_max: int,
    ) -> None:
        self._redis = redis
        self._keys = keys
        # Where a board's definition is looked for before a close step writes (_deleted): the
        # stored definitions, never a cached copy.
        self._catalog = BoardCatalog(redis, keys)
        self._delay = timedelta(seconds=lateness + merge_interval + CLOSE_GRACE)
        self._size = size
        # The most messages a board's period outbox keeps (LADDER_PERIODS_OUTBOX_MAX).
        self._outbox_max = outbox_max
        # Boards found with nothing due: the definition looked at, and when its earliest
        # current period becomes due.
        self._quiet: dict[str, tuple[Board, datetime]] = {}

    async def close_board(self, board: Board, now: datetime | None = None) -> int:
        """Take each due period of ``board`` a step further; how many this call closed.

        A board found with nothing due is not looked at again (no Redis round trip) until the
        earliest of its current periods becomes due, as long as its definition stays the same."""
        moment = now or datetime.now(UTC)
        quiet = self._quiet.get(board.board_id)
        if quiet is not None and quiet[0] == board and moment < quiet[1]:
            return 0
        closed, any_due = 0, False
        next_due: datetime | None = None
        for period in board.periods:
            if period == "alltime":
                continue
            current = window_at(period, moment - self._delay, board.timezone, board.schedule)
            if current.end is not None:
                due_at = current.end + self._delay
                next_due = due_at if next_due is None else min(next_due, due_at)
            # Oldest first, and none claimed before the ones before it: the watermark moves to a
            # claimed period's end, so an older one claimed after it would never be looked at.
            waiting = False
            for window in await self._due(board, current):
                any_due = True
                done = await self._close(board, window, moment, claim=not waiting)
                closed += done is True
                waiting = waiting or done is None
        if any_due or next_due is None:
            self._quiet.pop(board.board_id, None)
        else:
            self._quiet[board.board_id] = (board, next_due)
        return closed

    def keep_only(self, board_ids: set[str]) -> None:
        """Forget the boards found quiet but those defined now: a deleted board's definition
        would stay for the life of the process."""
        self._quiet = {bid: quiet for bid, quiet in self._quiet.items() if bid in board_ids}

    async def _due(self, board: Board, current: PeriodWindow) -> list[PeriodWindow]:
        """The periods before ``current`` that ended after the watermark, oldest first; the
        latest alone if none of this kind was closed or closing yet (no watermark)."""
        tz, schedule = board.timezone, board.schedule
        earlier = windows_before(current, tz, board.retention.of(current.period) or 1, schedule)
        raw = await self._redis.get(self._keys.period_watermark(board.board_id, current.period))
        if raw is None:
            return [latest] if (latest := next(earlier, None)) is not None else []
        mark = float(raw)
        due: list[PeriodWindow] = []
        for window in earlier:
            if window.end is None or window.end.timestamp() <= mark:
                break
            due.append(window)
        return due[::-1]

    async def _regions(self, board: Board, window: PeriodWindow) -> list[str]:
        found: set[str] = set(board.regions or ())
        key = self._keys.regions(board.board_id, window.period, window.period_id)
        found |= {str(r) for r in await self._redis.smembers(key)}
        return sorted(found)

    async def _close(
        self, board: Board, window: PeriodWindow, now: datetime, *, claim: bool = True
    ) -> bool | None:
        """A step of one period's close: True if this call closed it, False if it was closed
        before, None while it waits (its marks just made, their merge not done, or ``claim``
        not set: an older period of its kind still waits)."""
        keys, bid = self._keys, board.board_id
        period, pid, name = window.period, window.period_id, close_name(window)
        claimed = keys.period_closed(bid, period, name)
        if await self._redis.exists(claimed):
            return False
        regions = await self._regions(board, window)
        closing = keys.period_closing(bid, period, name)
        expiry = kept_until = board_period_expiry(board, period, pid)
        if expiry:
            expiry = max(expiry, int(now.timestamp()) + MARK_FLOOR)
        since = await self._redis.get(closing)
        if since is None:
            if await self._deleted(board):
                return None
            await self._mark_all(board, window, regions)
            # Again once the marks are in: a large board's take many calls, and the marker
            # and watermark must not outlive a deletion that began meanwhile.
            if not await self._deleted(board):
                await self._note_marked(board, window, closing, now, expiry)
            return None
        taken, *derived = str(since).split(" ", 2)
        if not claim or await self._merging(bid, int(taken)):
            return None
        if derived and await self._underived(board, window, now, *derived):
            return None
        scopes = await final_tops(self._redis, keys, board, window, regions, self._size)
        closed_at = rfc3339(now)
        ended = int(window.end.timestamp()) if window.end else 0
        message, *pushes = announced(keys, board, window, scopes, closed_at)
        args = [closed_at, expiry, ended, self._outbox_max, f"{bid}:{period}:{name}", message]
        if await self._deleted(board):
            return None
        if not message and 0 < kept_until <= now.timestamp():
            # Closed late (the aggregator stopped for longer than the period is kept): its views
            # are gone, and who scored in it is not known here any more.
            log.warning(
                "period closed after its views expired: nothing announced",
                board_id=bid,
                period=period,
                period_id=pid,
            )
        call_keys = [claimed, keys.period_watermark(bid, period), keys.periods_outbox(bid)]
        reply = await self._redis.fcall(CLOSE_PERIOD_FUNCTION, 3, *call_keys, *args, *pushes)
        done, dropped = bool(int(reply[0])), int(reply[1])
        if dropped:
            DROPPED.inc(dropped)
            log.warning(
                "period outbox full: its oldest period.closed messages dropped",
                board_id=bid,
                dropped=dropped,
                kept=self._outbox_max,
            )
        if done:
            CLOSED.inc()
            log.info(
                "period closed",
                board_id=bid,
                period=period,
                period_id=pid,
                scopes=len(scopes),
                sent=bool(message),
            )
            await self._forget_as_of(board, window)
        return done

    async def _deleted(self, board: Board) -> bool:
        """Whether ``board``'s definition is gone since the tick read it: a close step that
        writes is taken only for a board still defined. A close whose tick read the catalog
        before a deletion and wrote after its last pass (6 s after it began) left its claim,
        marks and message to a board made later under the name, whose relay sent the message.
        The look comes right before each writing step; the deletion takes the definition out
        before its first pass."""
        if await self._catalog.defined(board.board_id):
            return False
        log.info("period close left: the board was deleted", board_id=board.board_id)
        return True

    async def _forget_as_of(self, board: Board, window: PeriodWindow) -> None:
        """The merge's as_of of the period whose views expired as this one ended (``retention``
        periods before it): the board's as_of hash keeps the periods it keeps, not every period
        ever merged (a board of minute seasons would add half a million fields a year)."""
        retention = board.retention.of(window.period)
        if retention is None:
            return
        try:
            gone = previous_window(window, board.timezone, retention + 1, board.schedule)
        except PeriodRangeError:
            return
        field = f"{window.period}:{gone.period_id}"
        await self._redis.hdel(self._keys.as_of(board.board_id), field)

    async def _note_marked(
        self, board: Board, window: PeriodWindow, closing: str, now: datetime, expiry: int
    ) -> None:
        """Note the marks made (step 1): the board's take count, read after the marks went in (a
        take counted past it took every one of them), and on an incr board the time and the
        newest event, whose derive the teams scope waits for.

        A kind's first close also sets its watermark, where none is, to the period's start: from
        then on the period is due until claimed, as are those after it. Without it the close
        looked at the latest period alone until a claim set the watermark, and a first close
        still waiting when the next period fell due (a minute season waiting for its derive
        step) was passed over, never claimed."""
        keys, bid = self._keys, board.board_id
        found: list[Any] = await self._redis.mget(keys.merge_takes(bid), keys.newest_event(bid))
        takes, newest = found
        noted = f"{int(takes or 0)}"
        if newest and board.operator == "incr":
            noted += f" {int(now.timestamp())} {newest}"
        start = int(window.start.timestamp())
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.period_watermark(bid, window.period), start, nx=True)
            pipe.set(closing, noted, exat=expiry or None)
            await pipe.execute()

    async def _underived(
        self, board: Board, window: PeriodWindow, now: datetime, since: str, newest: str
    ) -> bool:
        """Whether the close still waits for the derive step, whose team boards make the teams
        scope: the event the board accepted last when the close made its marks (at ``since``,
        Unix seconds) is not derived yet, and ``DERIVE_WAIT`` has not passed since. The derive
        step applies a board's events in the order they were accepted, so with that one every
        event of the period is in. Past the wait the close goes on, and says so."""
        if not await underived(self._redis, self._keys, board.board_id, [newest]):
            return False
        if now.timestamp() < int(since) + DERIVE_WAIT:
            return True
        log.warning(
            "period closed before the derive step caught up: its teams scope may trail",
            board_id=board.board_id,
            period=window.period,
            period_id=window.period_id,
            waited_for=newest,
        )
        return False

    async def _mark_all(self, board: Board, window: PeriodWindow, regions: list[str]) -> None:
        """Mark every user of the period's regional boards dirty for the merge."""
        keys, bid = self._keys, board.board_id
        dirty = keys.dirty(bid)
        for region in regions:
            view = keys.region_view(bid, window.period, window.period_id, region)
            marks: list[str] = []
            async for member, _ in self._redis.zscan_iter(view, count=MARK_CHUNK):
                marks.append(dirty_member(window.period, window.period_id, region, id_of(member)))
                if len(marks) >= MARK_CHUNK:
                    await self._redis.sadd(dirty, *marks)
                    marks = []
            if marks:
                await self._redis.sadd(dirty, *marks)

    async def _merging(self, bid: str, since: int) -> bool:
        """Whether the merge may still hold a mark of the period, whose users were marked when
        the board's take counter stood at ``since``: until a batch taken after that (the counter
        past it) is drained, unless nothing waits at all. Three reads, whatever the sets hold: a
        scan of them for the period's marks cost Redis about 0.2 ms for each thousand marks,
        every tick, up to the whole of a backlog of other periods."""
        keys = self._keys
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.exists(keys.dirty_merging(bid))
            pipe.exists(keys.dirty(bid))
            pipe.get(keys.merge_takes(bid))
            merging, dirty, takes = await pipe.execute()
        if merging:
            return True
        return bool(dirty) and int(takes or 0) <= since


async def tick(closer: Closer, catalog: BoardCatalog, stop: asyncio.Event) -> None:
    """Close what is due on every board every ``CLOSE_TICK`` seconds until ``stop``."""
    while not stop.is_set():
        try:
            boards = await catalog.all()
            closer.keep_only({board.board_id for board in boards})
            for board in boards:
                # One board's failure is its own: the boards after it still close on time.
                with board_step(board, "period close"):
                    await closer.close_board(board)
        except Exception:
            log.exception("period close pass failed; retrying next tick")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CLOSE_TICK)
