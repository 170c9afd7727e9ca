"""The erasure worker (docs/api.md section 8b): erases the users and deletes the boards whose
requests MySQL holds pending, in the background of every API process.

A request is recorded in MySQL before the API answers 202 (:mod:`shared.erasure`), so a job
survives any restart: the worker polls for pending ones every ``POLL_SECONDS`` (with none, a
poll is one statement and one Redis read); a MySQL named lock lets one process at a time work
them (the steps are idempotent anyway). Each job runs two passes: one at once, and one after its
cut-off, which catches whatever was accepted, derived or stored while the first ran (a write
accepted by a process that still had the board cached, an event the history consumer stored
just before the tombstone); then it is marked done. The user's writes wait until then
(services/api/erasing.py): nothing it has in Redis is a fresh user's.

A user's pass: on every board, the user's entry in every view of every period the board keeps
(its regions: those the user, the board and the periods name), its name, team, regions,
badges, rate bucket, MVP contributions, feed and hot entries (``ladder_erase_user_v3``,
shared/erased_views.py); its friend sets, both directions, and in MySQL its friendships and
friend requests both ways; its events, taken out of the event counters they were counted in,
each once (services/api/erased_counts.py), then deleted: in MySQL those accepted by the
cut-off, in Redis the event records naming it, found by one ``SCAN`` of the keyspace for all
the users whose pass a round makes (not one a user: a queue of erasures walks it once); its
entries in stored snapshots and in the ``period.closed`` messages still waiting in a period
outbox (rewritten without them, services/api/erased_periods.py).

A board's pass: every key of its hash tag (one ``SCAN`` for all the boards a round deletes,
``UNLINK`` in batches) but its period outbox's entries, parked for the period relay first
(shared/parked_periods.py), and with ``purge`` its own events and snapshots in MySQL up to the
cut-off (an earlier board of the name keeps its history).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import structlog
from redis.asyncio import Redis
from sqlalchemy import delete, exists, or_, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.api.erased_counts import take_out_events
from services.api.erased_periods import erase_from_period_outboxes
from services.api.erased_rows import erase_from_snapshots, purge_board
from shared.boards import Board, BoardCatalog
from shared.db import (
    board_deletions,
    erasures,
    friend_requests,
    friendships,
    hidden_users,
)
from shared.erased_views import Found, erase_from_board
from shared.erasure import (
    BoardDeletion,
    Erasure,
    finish_board_deletion,
    finish_erasure,
    pending_board_deletions,
    pending_erasures,
    to_ms,
)
from shared.keys import Keys
from shared.parked_periods import is_parked, park, parked_set

log = structlog.get_logger(__name__)

POLL_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0
SCAN_COUNT = 1000
UNLINK_BATCH = 500
# Past the cut-off, before the second pass: a consumer batch that read the projections just
# before them is stored by then.
SECOND_PASS_MARGIN = timedelta(seconds=0.5)


def _unsuffixed(key: str) -> str:
    """A view's key from the key of its records (``<view>:ties``)."""
    return key.removesuffix(":ties")


# An erasure or a board deletion, each worked in two passes around its cut-off, and its mark.
Job = TypeVar("Job", Erasure, BoardDeletion)
Marker = Callable[[Job], tuple[str, datetime]]


@dataclass(frozen=True)
class Scanned:
    """What one ``SCAN`` of every board's keys found: the event records naming each user looked
    for, and every board's views (their periods, regions and MVP teams' member sets)."""

    records: dict[str, list[str]]
    views: dict[str, Found]


class Eraser:
    def __init__(
        self,
        engine: AsyncEngine,
        redis: Redis,
        keys: Keys,
        catalog: BoardCatalog,
        future_tolerance: float,
    ) -> None:
        self._engine = engine
        self._redis = redis
        self._keys = keys
        self._catalog = catalog
        self._future = timedelta(seconds=future_tolerance)
        self._stop = asyncio.Event()
        self._first_pass_done: set[tuple[str, datetime]] = set()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Work pending jobs until :meth:`stop`; a failed round (MySQL or Redis away) is logged
        and tried again, backing off up to ``RETRY_MAX_SECONDS`` so an outage is not a log line
        every poll."""
        wait = POLL_SECONDS
        while not self._stop.is_set():
            try:
                await self.round()
                wait = POLL_SECONDS
            except Exception as exc:
                log.warning("erasure round failed; trying again", error=repr(exc), retry_in=wait)
                wait = min(wait * 2, RETRY_MAX_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)

    async def round(self) -> int:
        """Work what is pending, under the lock (another process working them: nothing here).
        Returns how many jobs were finished."""
        if not await self._anything_to_do():
            return 0
        name = f"ladder.erasure.{self._engine.url.database}"[:64]
        async with self._engine.connect() as conn:
            got = await conn.scalar(text("SELECT GET_LOCK(:name, 0)"), {"name": name})
            await conn.commit()
            if got != 1:
                return 0
            try:
                return await self._work()
            finally:
                await conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
                await conn.commit()

    async def _anything_to_do(self) -> bool:
        """Whether a round has work: a first pass made here, a user marked erasing in Redis (a
        mark of a job done is taken away by a round), or a job pending in MySQL. Read without the
        lock, in one statement: every API process polls, and an idle poll would otherwise cost
        MySQL a lock taken and given back and a query for each kind of job."""
        if self._first_pass_done or await self._redis.exists(self._keys.erasing):
            return True
        pending = select(
            or_(
                exists().where(erasures.c.done_at.is_(None)),
                exists().where(board_deletions.c.done_at.is_(None)),
            )
        )
        async with self._engine.connect() as conn:
            return bool(await conn.scalar(pending))

    async def _work(self) -> int:
        """Each pending job's pass due. A job that fails leaves the others to go on; the round
        then fails, and is tried again after the back-off."""
        now = datetime.now(UTC)
        held = await self._redis.hkeys(self._keys.erasing)
        erasures = await pending_erasures(self._engine)
        await self._keep_erasing(held, erasures)
        finished, failed = await self._erase_users(erasures, now)
        deletions = await pending_board_deletions(self._engine)
        due = self._due(deletions, now, lambda d: (d.board_id, d.cutoff))
        await self.delete_boards([deletion for deletion, _ in due])
        for deletion, second in due:
            marker = (deletion.board_id, deletion.cutoff)
            self._first_pass_done.add(marker)
            if second:
                await finish_board_deletion(self._engine, deletion)
                self._first_pass_done.discard(marker)
                log.info("board deleted", board_id=deletion.board_id, purge=deletion.purge)
                finished += 1
        # The marks of jobs pending no more go: another process, holding the lock then, made
        # their second pass (else each such job left its mark here for good).
        self._first_pass_done &= {(e.user_hash, e.cutoff) for e in erasures} | {
            (d.board_id, d.cutoff) for d in deletions
        }
        if failed:
            raise RuntimeError(f"{failed} erasure(s) failed this round")
        return finished

    async def _erase_users(self, erasures: list[Erasure], now: datetime) -> tuple[int, int]:
        """Each pending erasure's pass due at ``now``: the first, or the second (after its
        cut-off), which finishes it. One ``SCAN`` for all their users: a thousand erasures do
        not scan the keyspace a thousand times. Returns how many finished and how many failed."""
        due = self._due(
            [e for e in erasures if e.user_id is not None], now, lambda e: (e.user_hash, e.cutoff)
        )
        if not due:
            return 0, 0
        scanned = await self._scan({e.user_id for e, _ in due if e.user_id is not None})
        finished = failed = 0
        for erasure, second in due:
            marker = (erasure.user_hash, erasure.cutoff)
            assert erasure.user_id is not None  # those without one were left out above
            try:
                await self.erase_user(erasure.user_id, erasure.cutoff, scanned)
            except Exception as exc:
                log.warning("erasure failed", user_hash=erasure.user_hash, error=repr(exc))
                failed += 1
                continue
            self._first_pass_done.add(marker)
            if second:
                await finish_erasure(self._engine, erasure)
                await self._redis.hdel(self._keys.erasing, erasure.user_hash)
                self._first_pass_done.discard(marker)
                log.info("user erased", user_hash=erasure.user_hash)
                finished += 1
        return finished, failed

    def _due(self, jobs: list[Job], now: datetime, marker: Marker[Job]) -> list[tuple[Job, bool]]:
        """The jobs whose pass is due at ``now``, each with whether it is the second (past its
        cut-off and the margin): a first pass made here already is not made again."""
        done, margin = self._first_pass_done, SECOND_PASS_MARGIN
        return [(j, s) for j in jobs if (s := now > j.cutoff + margin) or marker(j) not in done]

    async def _keep_erasing(self, held: list[Any], pending: list[Erasure]) -> None:
        """``Keys.erasing`` made the pending erasures' users (services/api/erasing.py): an entry
        Redis lost (or the end of an erasure asked again meanwhile removed) comes back, one a
        crash left after its erasure was done goes. ``held`` was read first: an entry in it was
        in MySQL before ``pending`` was read. Their tombstones are written to ``Keys.erased``
        too, before the round's passes, whether or not the request wrote them (its process may
        have stopped between MySQL and Redis): the aggregator's look after each apply reads them
        there (services/aggregator/late_erasures.py), and a batch applied too late for the last
        pass is looked at after that pass began, so after they were written."""
        wanted = {e.user_hash: to_ms(e.cutoff) for e in pending if e.user_id is not None}
        stale = {h.decode() if isinstance(h, bytes) else h for h in held} - set(wanted)
        async with self._redis.pipeline(transaction=False) as pipe:
            if stale:
                pipe.hdel(self._keys.erasing, *stale)
            if wanted:
                pipe.hset(self._keys.erasing, mapping={h: c for h, c in wanted.items()})
                pipe.hset(self._keys.erased, mapping={h: c for h, c in wanted.items()})
            await pipe.execute()

    # -- a user ------------------------------------------------------------------------------

    async def erase_user(
        self, user_id: str, cutoff: datetime, scanned: Scanned | None = None
    ) -> None:
        """One pass of a user's erasure (idempotent), with what a ``SCAN`` made at the pass's
        start found (``scanned``: the round's, with this user among those it looked for), or
        with a ``SCAN`` of its own."""
        if scanned is None:
            scanned = await self._scan({user_id})
        records, views = scanned.records.get(user_id, []), scanned.views
        boards = await self._catalog.all()
        for board in boards:
            await self._erase_from_board(board, user_id, views.get(board.board_id, Found()))
        await self._erase_hidden(user_id, boards)
        ids = [board.board_id for board in boards]
        await erase_from_period_outboxes(self._redis, self._keys, ids, user_id)
        await self._erase_friends(user_id)
        # Its events out of the counters (each once, if counted) and MySQL; its records go.
        by_id = {board.board_id: board for board in boards}
        await take_out_events(
            self._engine, self._redis, self._keys, by_id, user_id, cutoff, records
        )
        await erase_from_snapshots(self._engine, user_id)

    async def _scan(self, users: set[str]) -> Scanned:
        """One ``SCAN`` of every board's keys: the event records (idempotency answers, seen
        marks) naming each of ``users``, the periods and regions of every board's views and its
        MVP teams' member sets, so that none is missed: a region the aggregator has not derived
        into the regions sets yet, a period the definition no longer names (kept longer before),
        a team the user left."""
        records: dict[str, list[str]] = {}
        views: dict[str, Found] = {}
        async for key in self._redis.scan_iter(match=self._keys.boards_match(), count=SCAN_COUNT):
            name = key.decode() if isinstance(key, bytes) else key
            if (user := self._keys.record_user(name)) is not None:
                if user in users:
                    records.setdefault(user, []).append(name)
            # A view's sorted set, or its records: a view whose only entries are hidden users'
            # has records and no sorted set (a region named "ties" has a view that ends so).
            elif view := self._keys.view_of(name) or self._keys.view_of(_unsuffixed(name)):
                found = views.setdefault(view[0], Found())
                found.windows.add((view[1], view[2]))
                if view[3] is not None:
                    found.regions.add(view[3])
            elif (board_id := self._keys.team_set_of(name)) is not None:
                views.setdefault(board_id, Found()).team_sets.add(name)
        return Scanned(records, views)

    async def _erase_from_board(self, board: Board, user_id: str, seen: Found) -> int:
        # A rebuild under way puts its staged views, replayed from MySQL before this erasure
        # reached it, in place of the live ones when it finishes: the pass waits for it.
        if await self._redis.exists(self._keys.rebuilding(board.board_id)):
            raise RuntimeError(
                f"board {board.board_id!r} is being rebuilt; the erasure waits for it"
            )
        return await erase_from_board(self._redis, self._keys, board, user_id, seen, self._future)

    async def _erase_hidden(self, user_id: str, boards: list[Board]) -> None:
        """The boards' records of the user as hidden (MySQL first, then each board's set): a
        hidden user's entries were in no view, and its records went with the board's step.
        The table's key begins with the board: the boards it holds (a board being deleted
        among them) are read first, one dive a board, and the user's rows are a key a board,
        where a statement on the user alone scanned the table and locked every row."""
        h = hidden_users.c
        async with self._engine.begin() as conn:
            held = list(await conn.scalars(select(h.board_id).distinct()))
            if held:
                await conn.execute(
                    delete(hidden_users).where(h.board_id.in_(held), h.user_id == user_id)
                )
        async with self._redis.pipeline(transaction=False) as pipe:
            for board in boards:
                pipe.srem(self._keys.hidden(board.board_id), user_id)
            await pipe.execute()

    async def _erase_friends(self, user_id: str) -> None:
        """MySQL first (the source of truth), then the friend sets both ways. Both directions
        of a friendship are rows, written and deleted together: the rows naming the user as
        the friend are found from the user's own, one range of the primary key, read with
        their locks so that the deletes take what was read (``friend_id`` has no index, and a
        statement on it scanned the table, locking every row). Requests are indexed both
        ways."""
        f, r = friendships.c, friend_requests.c
        async with self._engine.begin() as conn:
            mirrors = select(f.friend_id).where(f.user_id == user_id).with_for_update()
            friend_ids = list(await conn.scalars(mirrors))
            await conn.execute(delete(friendships).where(f.user_id == user_id))
            if friend_ids:
                await conn.execute(
                    delete(friendships).where(f.user_id.in_(friend_ids), f.friend_id == user_id)
                )
            await conn.execute(
                delete(friend_requests).where(or_(r.user_id == user_id, r.friend_id == user_id))
            )
        own = self._keys.friends(user_id)
        friends: set[Any] = await self._redis.smembers(own)
        async with self._redis.pipeline(transaction=False) as pipe:
            for friend in friends:
                pipe.srem(self._keys.friends(friend), user_id)
            pipe.unlink(own)
            await pipe.execute()

    # -- a board -----------------------------------------------------------------------------

    async def delete_boards(self, deletions: list[BoardDeletion]) -> int:
        """One pass of each board deletion (idempotent): its definition in Redis, every key of
        its hash tag, and with ``purge`` its history up to the cut-off. One ``SCAN`` finds the
        keys of them all (a board's own pattern for one, every board's for several: a thousand
        deletions do not scan the keyspace a thousand times). Returns keys unlinked."""
        if not deletions:
            return 0
        tags = {self._keys.tag(d.board_id): d.board_id for d in deletions}
        # Their projection first, whether or not the request wrote it (its process may have
        # stopped between MySQL and Redis): the notifier's look after each batch reads it there
        # (services/notifier/late_erasures.py), and a batch written too late for the last pass
        # is looked at after that pass began, so after it was written.
        await self._redis.hset(
            self._keys.deleted_boards, mapping={d.board_id: to_ms(d.cutoff) for d in deletions}
        )
        await self._redis.hdel(self._keys.boards, *tags.values())
        # Its period.closed messages not yet published stay, parked for the period relay.
        for deletion in deletions:
            await park(self._redis, self._keys, deletion.board_id, to_ms(deletion.cutoff))
        one = self._keys.board_match(deletions[0].board_id)
        match = one if len(tags) == 1 else self._keys.boards_match()
        # A close that read the definition before it went may still queue a message after the
        # park: the outbox is left to the scan's end and parked again then, not unlinked.
        outboxes = {self._keys.periods_outbox(d.board_id) for d in deletions}
        gone, batch, parked = 0, [], []
        async for key in self._redis.scan_iter(match=match, count=SCAN_COUNT):
            if key[: key.find("}") + 1] not in tags or key in outboxes:
                continue
            if is_parked(self._keys, key):
                parked.append(key)
            else:
                batch.append(key)
            if len(batch) >= UNLINK_BATCH:
                gone += await self._redis.unlink(*batch)
                batch = []
        if batch:
            gone += await self._redis.unlink(*batch)
        for deletion in deletions:  # an empty outbox goes in the same step
            await park(self._redis, self._keys, deletion.board_id, to_ms(deletion.cutoff))
        if parked:  # named again, where a relay died between forgetting one and removing it
            await self._redis.sadd(parked_set(self._keys), *parked)
        for deletion in deletions:
            if deletion.purge:
                await purge_board(self._engine, deletion)
        return gone


__all__ = ["Eraser", "Erasure"]
