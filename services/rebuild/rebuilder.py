"""The rebuild of every board, or of some, one after the other: restore the definitions and
friendships, then per board raise its flag, wait for MySQL, replay the event log onto staging and
finish (the steps are in :mod:`services.rebuild`), starting a board again if its finish refuses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.rebuild.event_log import held, pages
from services.rebuild.finish import finish, mark_dirty
from services.rebuild.flag import FLAG_TTL_MS, BoardFlag, FlagLost, ensure_outbox_group
from services.rebuild.keyspace import Existing, dense_builds, existing, region_views
from services.rebuild.staging import Staged, expire_former, journaled_refs, replay
from shared import hidden
from shared.boards import Board, BoardCatalog
from shared.db import from_db_time
from shared.derived import underived
from shared.erasure import restore_projections, stored_tombstones, to_ms
from shared.keys import Keys
from shared.restore import reconcile_friendships, restore_definitions
from shared.settings import LadderSettings

log = structlog.get_logger(__name__)

ATTEMPTS = 5


class RebuildFailed(RuntimeError):
    """A board could not be rebuilt (MySQL never caught up, or the rebuild kept losing its
    flag); Redis keeps what it had for it. ``done``: the boards rebuilt all the same."""

    def __init__(self, message: str, done: list[BoardRebuild] | None = None) -> None:
        super().__init__(message)
        self.done = done or []


@dataclass
class BoardRebuild:
    """What one board's rebuild did, for the summary line."""

    board_id: str
    events: int = 0
    journal_replayed: int = 0
    journal_known: int = 0
    keys: int = 0
    dirty: int = 0
    attempts: int = 0
    refused: int = 0
    seconds: float = 0.0


class Rebuilder:
    def __init__(
        self,
        engine: AsyncEngine,
        redis: Redis,
        keys: Keys,
        settings: LadderSettings,
        wait_seconds: float = 120.0,
        restored: bool = False,
    ) -> None:
        self._engine = engine
        self._redis = redis
        self._keys = keys
        self._settings = settings
        self._wait_seconds = wait_seconds
        # The history database was restored from a backup: it may lack for good events Redis
        # applied (stored after the backup was taken), which a rebuild then leaves out.
        self._restored = restored
        self._flags: dict[str, BoardFlag] = {}

    async def run(self, only: Iterable[str] = ()) -> list[BoardRebuild]:
        """Definitions and friendships, then every board (or only those named)."""
        boards = await restore_definitions(self._engine, BoardCatalog(self._redis, self._keys))
        friends = await reconcile_friendships(self._engine, self._redis, self._keys)
        await restore_projections(self._engine, self._redis, self._keys)
        log.info(
            "definitions and friendships restored",
            boards=len(boards),
            friend_sets=friends.users,
            added=friends.added,
            removed=friends.removed,
        )
        wanted = set(only)
        unknown = wanted - {b.board_id for b in boards}
        if unknown:
            raise RebuildFailed(f"no such board in the history database: {sorted(unknown)}")
        chosen = [b for b in boards if not wanted or b.board_id in wanted]
        # One pass over the keyspace for every board, rather than one a board.
        found = await existing(
            self._redis, self._keys, [b.board_id for b in chosen], "{" + self._keys.prefix + ":"
        )
        # A board that cannot be rebuilt holds back none after it: Redis may have lost them all.
        done: list[BoardRebuild] = []
        failed: list[str] = []
        for board in chosen:
            try:
                done.append(await self.board(board, found[board.board_id]))
            except RebuildFailed as exc:
                log.error("board not rebuilt; the others go on", board_id=board.board_id)
                failed.append(str(exc))
        if failed:
            raise RebuildFailed(
                f"{len(failed)} of {len(chosen)} boards not rebuilt: " + "; ".join(failed), done
            )
        return done

    async def board(self, board: Board, found: Existing | None = None) -> BoardRebuild:
        """Rebuild one board (see :mod:`services.rebuild`); ``found``: its keys as they were
        before (looked up here if not given)."""
        started = time.monotonic()
        done = BoardRebuild(board.board_id)
        bid = board.board_id
        if found is None:
            found = (await existing(self._redis, self._keys, [bid], self._keys.tag(bid) + ":"))[bid]
        flag = self._flags[bid] = BoardFlag(self._redis, self._keys, bid)
        await ensure_outbox_group(self._redis, self._keys, bid)
        for attempt in range(1, ATTEMPTS + 1):
            done.attempts = attempt
            applied = await flag.begin()
            if applied is None:
                raise RebuildFailed(
                    f"board {bid!r} is being rebuilt by another process (its flag {flag.flag} "
                    f"lapses within {FLAG_TTL_MS // 1000} s if that one died)"
                )
            try:
                # Staging a dead rebuild left behind: the board is ours now.
                if found.staging:
                    await self._redis.unlink(*found.staging)
                    found.staging.clear()
                await self._wait_stored(bid, applied)
                await self._wait_derived(bid, applied)
                outcome, views = await self._build(board, done, found.live)
            except BaseException:
                await flag.abort()
                raise
            if outcome == "ok":
                done.dirty = await mark_dirty(
                    self._redis, self._keys, bid, views | found.global_views
                )
                await self._build_again(bid, found.live)
                done.seconds = time.monotonic() - started
                log.info("board rebuilt", **done.__dict__)
                return done
            await flag.abort()
            log.warning("board rebuild starts again", board_id=bid, reason=outcome)
            await asyncio.sleep(min(2.0 * attempt, 10.0))
        raise RebuildFailed(f"board {bid!r} not rebuilt after {ATTEMPTS} attempts")

    async def _build_again(self, board_id: str, live: set[str]) -> None:
        """The regional views that had a distinct-score set (or one being built) before the
        rebuild, which the finish dropped, asked of the aggregator's dense build again, if the
        board is still read densely in a region (its marker names the scope): the aggregator
        builds each from the rebuilt view, as after a dense read. (A board of the layout
        before, whose write kept a set beside every regional view, is not marked so.)"""
        keys = self._keys
        wanted = dense_builds(keys, board_id, live)
        if wanted and await self._redis.sismember(keys.dense(board_id), "region"):
            await self._redis.sadd(keys.dense_build(board_id), *sorted(wanted))

    async def _wait_stored(self, board_id: str, refs: list[str]) -> None:
        """Until MySQL holds every one of the board's events ``refs`` names
        (``shared.keys.event_ref``)."""

        async def unstored(pending: list[str]) -> list[str]:
            async with self._engine.connect() as conn:
                stored = await held(conn, board_id, set(pending))
            return [ref for ref in pending if ref not in stored]

        await self._wait(
            board_id,
            refs,
            unstored,
            "not in the history database",
            "history",
            lost=self._restored,
        )

    async def _wait_derived(self, board_id: str, refs: list[str]) -> None:
        """Until the aggregator has derived every one of the events ``refs`` names (their
        records' derive-pending bits clear, or their records gone; an event accepted before ids
        were scoped to users has its record under its id alone, and so is waited for there too:
        that record is of an event older than these, derived before them, so waiting for it is
        right whichever user's it is). These are the newest events applied before
        the flag; the aggregator derives a board's events in the order they were accepted, so
        every event before them is derived too. The finish step clears the bits of the events
        applied after the flag (the journal's): together, every event the rebuild replays is
        one the aggregator will not derive again onto what the rebuild puts in place."""

        async def left(pending: list[str]) -> list[str]:
            return await underived(self._redis, self._keys, board_id, pending)

        await self._wait(board_id, refs, left, "not derived", "the aggregator")

    async def _wait(
        self,
        board_id: str,
        refs: list[str],
        left: Callable[[list[str]], Awaitable[list[str]]],
        state: str,
        consumer: str,
        lost: bool = False,
    ) -> None:
        """Poll ``left`` (which of the events it is given are still waited for) until it names
        none, keeping the board's flag; ``RebuildFailed`` after the wait's limit, saying which
        events are still ``state`` and which ``consumer`` to look at; or, where those may be
        ``lost`` (a restored history database lacks them for good), a warning naming them."""
        pending = list(dict.fromkeys(refs))  # once each, in order
        end = time.monotonic() + self._wait_seconds
        while pending:
            pending = await left(pending)
            if not pending:
                return
            if time.monotonic() > end and lost:
                log.warning(
                    "events applied in Redis that the restored history database lacks are left out",
                    board_id=board_id,
                    events=len(pending),
                    example=sorted(pending)[:3],
                )
                return
            if time.monotonic() > end:
                raise RebuildFailed(
                    f"board {board_id!r}: {len(pending)} events applied in Redis are {state} "
                    f"after {self._wait_seconds:g} s (is {consumer} consuming?), "
                    f"e.g. {sorted(pending)[:3]}"
                )
            await self._flags[board_id].extend()
            await asyncio.sleep(0.25)

    async def _build(
        self, board: Board, done: BoardRebuild, live: set[str]
    ) -> tuple[str, set[str]]:
        """One attempt: MySQL onto staging, then the finish step. Returns its outcome ("ok" or
        why not) and the regional views it made."""
        bid = board.board_id
        flag = self._flags[bid]
        staged, journal = Staged(), Staged()
        try:
            events, refused, known = await self._stage(board, staged, journal)
        except FlagLost:
            return "the flag lapsed", set()
        if self._restored:
            # Redis's event counters count events the restored database lacks: they are replaced
            # with the staged ones unchecked (the check would refuse the board every time).
            for keys in (staged, journal):
                keys.others |= keys.counters
                keys.counters = set()
        status, detail, made = await finish(
            self._redis, self._keys, flag, staged, journal, live, known
        )
        if status != "ok":
            return f"{status} {detail}".strip(), set()
        done.events, done.refused = events, refused
        done.journal_replayed, done.journal_known = int(detail), len(known)
        done.keys = made
        return "ok", region_views(self._keys, bid, staged.others)

    async def _stage(
        self, board: Board, staged: Staged, journal: Staged
    ) -> tuple[int, int, set[str]]:
        """The board's events, read in one consistent snapshot of MySQL, replayed onto staging
        (their keys noted in ``staged``); then, in the same snapshot, which of the journal's
        events it held (the journal's keys noted in ``journal``). Returns how many events were
        replayed, how many of them the board refused, and the journaled events held."""
        bid = board.board_id
        flag = self._flags[bid]
        events = refused = 0
        async with self._engine.connect() as conn:
            await conn.execution_options(isolation_level="REPEATABLE READ")
            # Every page below, and the journal lookup after them, read this one snapshot.
            await conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            await self._stage_hidden(conn, bid, staged)
            async for page in pages(conn, bid):
                # An erased user's events that history stored after the erasure deleted them
                # (in flight then) are not replayed: the tombstone's cut-off says whose they are.
                rows = await self._unerased(conn, page)
                refused += await self._replay(board, rows, staged)
                events += len(rows)
                await flag.extend()
            await expire_former(self._redis, self._keys, bid, staged)
            known = await held(conn, bid, journaled_refs(await flag.journaled(), journal))
            await conn.rollback()
        return events, refused, known

    async def _stage_hidden(self, conn: AsyncConnection, board_id: str, staged: Staged) -> None:
        """The board's hidden users as MySQL holds them, onto the staging copy of its Redis set,
        before any event is replayed: the replayed writes keep their entries out of every view
        (shared/lua/write.lua), and the finish puts the set in place (or deletes it: nobody
        hidden)."""
        key = self._keys.hidden(board_id)
        staged.others.add(key)
        users = await hidden.stored(conn, board_id)
        if users:
            await self._redis.sadd(self._keys.staged(board_id, key), *users)

    async def _unerased(self, conn: AsyncConnection, rows: Sequence[Any]) -> Sequence[Any]:
        secret = self._settings.effective_jwt_secret
        erased = await stored_tombstones(conn, {row.user_id for row in rows}, secret)
        if not erased:
            return rows
        return [
            row
            for row in rows
            if row.user_id not in erased
            or to_ms(from_db_time(row.accepted_at)) > erased[row.user_id]
        ]

    async def _replay(self, board: Board, rows: Sequence[Any], staged: Staged) -> int:
        return await replay(self._redis, self._keys, self._settings, board, rows, staged)
