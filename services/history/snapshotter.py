"""Top-N snapshots of the views that changed (docs/api.md section 7).

The history handler marks, for each event and each of its periods, the views the event changed:
its region, ``global`` and, with a team, ``teams``; the marks go into the board's set
``Keys.snapshot_dirty`` in Redis before the batch is acked, so a restart loses none. Every
``LADDER_SNAPSHOT_INTERVAL`` the ticker renames that set aside (a crash mid-pass leaves the renamed
set to be taken again), reads the top ``LADDER_SNAPSHOT_SIZE`` of each marked view and stores
them in MySQL, one row a view.

One history process at a time takes a board's snapshots (several may run): a pass holds the
board's snapshot lease (shared/lease.py, ``snap``), renewed before each chunk of views and
lapsing ``LEASE_SECONDS`` after a process that died, and a board held by another is left to it.
The pass's first step, which renames the set and gives the take its time, and its last, which
deletes the renamed set and gives the lease up, do so only while the pass still holds the
lease: a pass that lost it (paused past its time) deletes no set another pass has renamed since.

A view marked once is stored once. The lease cannot make sure of that alone: a pass may lose it
between its check and its MySQL write, and its successor takes the same set again. So a set
keeps the time it was taken at until it is done, whichever pass takes it over, every snapshot of
it is stored under that time, and the snapshots table's unique key on (board, scope, period,
period id, ``taken_at``) makes a second store of the same view's snapshot a no-op
(``shared.db_boards.save_snapshots``): of a paused pass and its successor, the first to store a
view stores it.

The aggregator fills the global view up to ``LADDER_MERGE_INTERVAL`` after the regional write
that marked it, so a pass may read it just before the merge lands. A global view taken on a
fresh mark is therefore marked once more, as a follow-up, and taken again on the next pass, by
which time the merge has long happened (as long as the snapshot interval is the longer one).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.boards import Board, BoardCatalog
from shared.db_boards import SnapshotRow, save_snapshots
from shared.entries import team_entry, user_entry
from shared.events import ScoreAccepted
from shared.functions import SNAPSHOT_DONE_FUNCTION, SNAPSHOT_TAKE_FUNCTION
from shared.keys import Keys
from shared.lease import Lease, LeaseLost, give_up
from shared.periods import PERIODS, Period
from shared.ranking import id_of
from shared.service import every_board

log = structlog.get_logger(__name__)

TAKEN = Counter("ladder_history_snapshots_total", "Snapshots of a view stored")

FOLLOW_UP = "again"
# Views read a Redis pipeline, and stored a MySQL statement, at a time.
CHUNK = 50
LEASE_SECONDS = 60.0
"""How long a board's snapshot lease lasts unless renewed (before each chunk of views): the
boards of a history process that died are taken by another within that."""


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)


def view_member(period: str, period_id: str, scope: str, *, follow_up: bool = False) -> str:
    """A member of the changed-views set. ``|`` cannot occur in any identifier or scope."""
    return f"{period}|{period_id}|{scope}" + (f"|{FOLLOW_UP}" if follow_up else "")


def parse_view_member(member: str) -> tuple[str, str, str, bool]:
    """``(period, period_id, scope, follow_up)`` of :func:`view_member`."""
    period, period_id, scope, *rest = member.split("|")
    return period, period_id, scope, rest == [FOLLOW_UP]


def changed_views(event: ScoreAccepted) -> list[str]:
    """The members naming every view ``event`` changed."""
    scopes = [f"region:{event.region}", "global"]
    if event.team_id is not None:
        scopes.append("teams")
    return [
        view_member(period, result.period_id, scope)
        for period, result in event.periods.items()
        for scope in scopes
    ]


class Snapshotter:
    """Takes the snapshots of one board's changed views (see the module docstring)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        engine: AsyncEngine,
        size: int,
        *,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._engine = engine
        self._size = size
        self.lease = Lease(redis, keys, ttl=lease_seconds, kind="snap")

    async def take_board(self, board: Board, now: datetime | None = None) -> int:
        """Snapshot every view of ``board`` marked since the last pass; how many were stored.

        An empty view (expired, or a team view of a board without teams) stores nothing. A board
        whose snapshot lease another history process holds is left to it (0).
        """
        bid = board.board_id
        dirty = self._keys.snapshot_dirty(bid)
        taking = self._keys.snapshot_dirty(bid, taking=True)
        if not await self._redis.exists(dirty, taking):
            return 0  # nothing changed
        if not await self.lease.hold(bid):
            return 0
        token = self.lease.token(bid)
        lease, take = self._keys.lease(bid, "snap"), self._keys.snapshot_take(bid)
        # Not over a set left by a pass cut short, which is taken first (under the time it was
        # taken at), the new marks after.
        moment = now or datetime.now(UTC)
        at = int(
            await self._redis.fcall(
                SNAPSHOT_TAKE_FUNCTION, 4, lease, dirty, taking, take, token, _ms(moment)
            )
        )
        if at < 0:
            log.warning("snapshot lease lost before the pass began", board_id=bid)
            return 0
        views, follow_ups = await self._marked(board, taking)
        taken_at = moment if not at else _moment(at)
        stored = 0
        ordered = sorted(views)
        for start in range(0, len(ordered), CHUNK):
            if start and not await self._still_held(bid):
                log.warning("snapshot lease lost; the pass stops", board_id=bid, stored=stored)
                TAKEN.inc(stored)
                return stored
            rows = await self._read(board, ordered[start : start + CHUNK], taken_at)
            # A snapshot another pass of the same take stored already is not stored again.
            stored += await save_snapshots(self._engine, rows)
        done = await self._redis.fcall(
            SNAPSHOT_DONE_FUNCTION, 4, lease, taking, dirty, take, token, *sorted(follow_ups)
        )
        if done:
            self.lease.forget(bid)  # given up by the call
        else:
            log.warning("snapshot lease lost; the views are taken again", board_id=bid)
        TAKEN.inc(stored)
        return stored

    async def _still_held(self, board_id: str) -> bool:
        """Renew the board's snapshot lease: whether this pass still holds it."""
        try:
            await self.lease.renew(board_id)
        except LeaseLost:
            return False
        return True

    async def _marked(
        self, board: Board, taking: str
    ) -> tuple[set[tuple[Period, str, str]], set[str]]:
        """The views ``taking`` marks, of the board's periods, and the follow-up marks of its
        fresh global ones (see the module docstring)."""
        views: set[tuple[Period, str, str]] = set()
        follow_ups: set[str] = set()
        async for member in self._redis.sscan_iter(taking, count=1000):
            period, period_id, scope, follow_up = parse_view_member(member)
            if period not in PERIODS or period not in board.periods:
                continue
            views.add((period, period_id, scope))
            if scope == "global" and not follow_up:
                follow_ups.add(view_member(period, period_id, scope, follow_up=True))
        return views, follow_ups

    async def _read(
        self, board: Board, views: list[tuple[Period, str, str]], taken_at: datetime
    ) -> list[SnapshotRow]:
        """The snapshot rows of ``views``, in two round trips: their tops, then the display
        names and each user view's records (``Keys.ties``) of the ids on top."""
        keys, bid = self._keys, board.board_id
        view_keys = [keys.board_view(bid, *view) for view in views]
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in view_keys:
                pipe.zrevrange(key, 0, self._size - 1, True)
            tops: list[list[tuple[str, float]]] = await pipe.execute()
        ranked = [
            (view, key, rows)
            for view, key, rows in zip(views, view_keys, tops, strict=True)
            if rows
        ]
        users = sorted(
            {id_of(m) for (_, _, scope), _, rows in ranked if scope != "teams" for m, _ in rows}
        )
        async with self._redis.pipeline(transaction=False) as pipe:
            if users:
                pipe.hmget(keys.names(bid), users)
            for (_, _, scope), key, rows in ranked:
                if scope != "teams":
                    pipe.hmget(Keys.ties(key), [id_of(m) for m, _ in rows])
            replies = iter(await pipe.execute())
        names: dict[str, str | None] = dict(zip(users, next(replies), strict=True)) if users else {}
        snapshots: list[SnapshotRow] = []
        for (period, period_id, scope), _, rows in ranked:
            if scope == "teams":
                entries = [team_entry(board, rank, *row) for rank, row in enumerate(rows, start=1)]
            else:
                records: list[str | None] = next(replies)
                entries = [
                    user_entry(board, rank, raw, stored, names.get(id_of(raw)), record)
                    for rank, ((raw, stored), record) in enumerate(
                        zip(rows, records, strict=True), start=1
                    )
                ]
            snapshots.append(
                {
                    "board_id": bid,
                    "scope": scope,
                    "period": period,
                    "period_id": period_id,
                    "taken_at": taken_at,
                    "entries": entries,
                }
            )
        return snapshots


async def tick(
    snapshotter: Snapshotter, catalog: BoardCatalog, interval: float, stop: asyncio.Event
) -> None:
    """Snapshot every board every ``interval`` seconds until ``stop``; one last pass on the way
    out, so that what changed since the last pass is kept. Then the snapshot leases still held
    (a pass that failed or was cut short keeps its board's) are given up: another process takes
    the board's set over at once, not after the lease's 60 s."""
    try:
        await every_board(catalog, interval, stop, snapshotter.take_board)
    finally:
        await give_up(snapshotter.lease)
