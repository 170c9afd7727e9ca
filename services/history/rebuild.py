"""``make rebuild``: every board recreated in Redis, exactly, from the history database.

Run as ``python -m services.history.rebuild [--board ID ...] [--wait SECONDS]``. Redis is a
projection (DESIGN.md invariant 4): this puts back, from MySQL alone, the board definitions and
friendships (:mod:`shared.restore`), and for each board its regional views of every period still
retained, team boards, distinct-score sets, feed, player and event counts, each user's regions
and team, and display names; then it marks every user of every view dirty, so the aggregator
merges the global views again through its own code.

Each event is replayed, in the order the event log stored it, through ``ladder_replay_v2``:
the very ``submit()`` of the write path, aimed at staging keys, leaving no idempotency answer and
no outbox entry. So the rebuilt sorted sets hold byte for byte what the writes made, as long as
the log holds the events in the order they were applied (one relay a board; with several, events
accepted within milliseconds of each other may be stored in another order: docs/reliability.md).

Writes may go on meanwhile. Per board:

1. ``ladder_rebuild_begin_v1`` raises the board's ``rebuilding`` flag, holding this rebuild's
   token (a second rebuild of the board at once is refused), with a TTL kept up while the
   rebuild works, and starts its journal: from then on every event ``submit()`` applies is
   also journaled. It returns the ids of the events in the outbox and of the newest in the feed.
2. Wait until MySQL holds those: then it holds every event applied before the flag (the relay
   publishes, and history stores, in outbox order).
3. Read the board's events in one consistent snapshot of MySQL, in keyset pages of the primary
   key (memory stays bounded by a page), replaying each onto staging.
4. In the same snapshot, look up which journaled events it held.
5. ``ladder_rebuild_finish_v2``, one atomic step: replay the other journaled events onto staging,
   check that no live event counter is ahead of its staged one (an event applied before the flag
   that MySQL did not hold yet: then all is thrown away and the board read again), rename
   staging over the live keys, drop the flag and journal.

Running it twice changes nothing: the second run builds the same keys from the same events.
docs/reliability.md has the argument in full.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.boards import Board, BoardCatalog
from shared.db import from_db_time, open_engine, score_events
from shared.functions import (
    REBUILD_ABORT_FUNCTION,
    REBUILD_BEGIN_FUNCTION,
    REBUILD_EXTEND_FUNCTION,
    REBUILD_FINISH_FUNCTION,
    REPLAY_FUNCTION,
)
from shared.keys import OUTBOX_GROUP, Keys, dirty_member
from shared.logs import configure
from shared.redis import open_redis
from shared.restore import restore_definitions, restore_friendships
from shared.settings import LadderSettings, load_settings
from shared.submit import SubmitEvent, finish_keys, replay_keys, replayed_keys, submit_call

log = structlog.get_logger(__name__)

PAGE = 2000  # events a MySQL page, and replays a Redis round trip
ID_CHUNK = 1000  # event ids an IN (...) lookup
FLAG_TTL_MS = 60_000
ATTEMPTS = 5
FINISH_TRIES = 10  # finish calls an attempt makes while events journaled meanwhile name new keys

# The board's keys that the rebuild makes (what follows the hash tag). Everything else under the
# tag belongs to others and is left alone: idempotency answers, the outbox, the aggregator's
# global views and marks, snapshot marks, badges, the live views, rate buckets. (`:counts` are
# the per-score counts that an earlier layout kept beside each view: a rebuild drops them.)
_REBUILT = re.compile(
    r"lb:[a-z]+:[^:]+:(region:[^:]+|teams)(:distinct|:counts)?"
    r"|(regions|players|events):[a-z]+:[^:]+"
    r"|user:.+:regions|names|feed|user-team"
)


_REGION_VIEW = re.compile(r"lb:[a-z]+:[^:]+:region:[^:]+")
_GLOBAL_VIEW = re.compile(r"lb:[a-z]+:[^:]+:global")


def _rebuilt_here(suffix: str) -> bool:
    return _REBUILT.fullmatch(suffix) is not None


class RebuildFailed(RuntimeError):
    """A board could not be rebuilt (MySQL never caught up, or the rebuild kept losing its
    flag); Redis keeps what it had."""


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


@dataclass
class _Existing:
    """One board's keys before its rebuild (see :meth:`Rebuilder._existing`)."""

    live: set[str] = field(default_factory=set)
    staging: set[str] = field(default_factory=set)
    global_views: set[str] = field(default_factory=set)


@dataclass
class _Staged:
    """The live names of the keys staged so far, event counters apart (checked at the end)."""

    counters: set[str] = field(default_factory=set)
    others: set[str] = field(default_factory=set)

    def add(self, call_keys: Sequence[str]) -> None:
        """The keys a replay of one ``submit()`` call stages."""
        counters, others = replayed_keys(call_keys)
        self.counters.update(counters)
        self.others.update(others)


def replay_call(
    keys: Keys, settings: LadderSettings, board: Board, row: Any
) -> tuple[list[str], list[str | int]]:
    """The keys (live names) and arguments of ``submit()`` for one stored event: what
    :func:`services.api.writes.prepare` built when the event was accepted."""
    event = SubmitEvent(
        row.event_id,
        row.user_id,
        row.region,
        row.team_id,
        row.display_name,
        row.value,
        from_db_time(row.occurred_at),
        from_db_time(row.accepted_at),
    )
    # No body hash: the scratch idempotency answer is deleted at once; and the scratch outbox
    # is empty at every call.
    return submit_call(
        keys,
        board,
        event,
        body_hash="",
        idempotency_ttl=settings.idempotency_ttl_seconds,
        outbox_max=1,
        feed_length=settings.feed_length,
    )


class Rebuilder:
    def __init__(
        self,
        engine: AsyncEngine,
        redis: Redis,
        keys: Keys,
        settings: LadderSettings,
        wait_seconds: float = 120.0,
    ) -> None:
        self._engine = engine
        self._redis = redis
        self._keys = keys
        self._settings = settings
        self._wait_seconds = wait_seconds
        self._tokens: dict[str, str] = {}

    async def run(self, only: Iterable[str] = ()) -> list[BoardRebuild]:
        """Definitions and friendships, then every board (or only those named)."""
        boards = await restore_definitions(self._engine, BoardCatalog(self._redis, self._keys))
        friendships = await restore_friendships(self._engine, self._redis, self._keys)
        log.info("definitions and friendships restored", boards=len(boards), rows=friendships)
        wanted = set(only)
        unknown = wanted - {b.board_id for b in boards}
        if unknown:
            raise RebuildFailed(f"no such board in the history database: {sorted(unknown)}")
        chosen = [b for b in boards if not wanted or b.board_id in wanted]
        # One pass over the keyspace for every board, rather than one a board.
        found = await self._existing([b.board_id for b in chosen], "{" + self._keys.prefix + ":")
        return [await self.board(b, found[b.board_id]) for b in chosen]

    async def board(self, board: Board, found: _Existing | None = None) -> BoardRebuild:
        """Rebuild one board (see the module's docstring); ``found``: its keys as they were
        before (looked up here if not given)."""
        started = time.monotonic()
        done = BoardRebuild(board.board_id)
        bid = board.board_id
        if found is None:
            found = (await self._existing([bid], self._keys.tag(bid) + ":"))[bid]
        flag, journal = self._keys.rebuilding(bid), self._keys.rebuild_journal(bid)
        # Whose flag it is: a second rebuild of the board at once is refused, and one whose flag
        # lapsed cannot finish over the next one's.
        token = self._tokens[bid] = uuid.uuid4().hex
        await self._ensure_outbox_group(bid)
        for attempt in range(1, ATTEMPTS + 1):
            done.attempts = attempt
            begun: list[Any] = await self._redis.fcall(
                REBUILD_BEGIN_FUNCTION,
                4,
                flag,
                journal,
                self._keys.outbox(bid),
                self._keys.feed(bid),
                FLAG_TTL_MS,
                token,
            )
            if begun[0] != "ok":
                raise RebuildFailed(
                    f"board {bid!r} is being rebuilt by another process (its flag {flag} "
                    f"lapses within {FLAG_TTL_MS // 1000} s if that one died)"
                )
            try:
                # Staging a dead rebuild left behind: the board is ours now.
                if found.staging:
                    await self._redis.unlink(*found.staging)
                    found.staging.clear()
                await self._wait_stored(bid, begun[1:])
                outcome, views = await self._build(board, done, found.live)
            except BaseException:
                await self._abort(bid)
                raise
            if outcome == "ok":
                done.dirty = await self._mark_dirty(board, views | found.global_views)
                done.seconds = time.monotonic() - started
                log.info("board rebuilt", **done.__dict__)
                return done
            await self._abort(bid)
            log.warning("board rebuild starts again", board_id=bid, reason=outcome)
            await asyncio.sleep(min(2.0 * attempt, 10.0))
        raise RebuildFailed(f"board {bid!r} not rebuilt after {ATTEMPTS} attempts")

    async def _abort(self, board_id: str) -> None:
        """Staging, flag and journal dropped, while the flag is still this rebuild's."""
        flag, journal = self._keys.rebuilding(board_id), self._keys.rebuild_journal(board_id)
        token = self._tokens[board_id]
        if await self._redis.get(flag) == token:
            await self._drop_staging(board_id)
        await self._redis.fcall(REBUILD_ABORT_FUNCTION, 2, flag, journal, token)

    async def _ensure_outbox_group(self, board_id: str) -> None:
        """The relay's consumer group on the outbox, made again if Redis lost it: the relays
        then publish what was accepted since (the rebuild waits for it), without a restart."""
        try:
            await self._redis.xgroup_create(
                self._keys.outbox(board_id), OUTBOX_GROUP, id="0", mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _extend(self, board_id: str) -> None:
        flag, journal = self._keys.rebuilding(board_id), self._keys.rebuild_journal(board_id)
        kept = await self._redis.fcall(
            REBUILD_EXTEND_FUNCTION, 2, flag, journal, FLAG_TTL_MS, self._tokens[board_id]
        )
        if not kept:
            raise _FlagLost

    async def _wait_stored(self, board_id: str, event_ids: list[str]) -> None:
        """Until MySQL holds every one of ``event_ids`` of the board."""
        pending = set(event_ids)
        end = time.monotonic() + self._wait_seconds
        while pending:
            async with self._engine.connect() as conn:
                pending -= await _held(conn, board_id, pending)
            if not pending:
                return
            if time.monotonic() > end:
                raise RebuildFailed(
                    f"board {board_id!r}: {len(pending)} events applied in Redis are not in the "
                    f"history database after {self._wait_seconds:g} s (is history consuming?), "
                    f"e.g. {sorted(pending)[:3]}"
                )
            await self._extend(board_id)
            await asyncio.sleep(0.25)

    async def _build(
        self, board: Board, done: BoardRebuild, live: set[str]
    ) -> tuple[str, set[str]]:
        """One attempt: MySQL onto staging, then the finish step. Returns its outcome ("ok" or
        why not) and the regional views it made."""
        bid = board.board_id
        staged = _Staged()
        events = refused = 0
        try:
            async with self._engine.connect() as conn:
                await conn.execution_options(isolation_level="REPEATABLE READ")
                # Every page below, and the journal lookup after them, read this one snapshot.
                await conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                after = 0
                while True:
                    rows = (await conn.execute(_page(bid, after))).all()
                    if not rows:
                        break
                    refused += await self._replay(board, rows, staged)
                    events += len(rows)
                    after = rows[-1].id
                    await self._extend(bid)
                journal = _Staged()
                known = await _held(conn, bid, await self._journaled(bid, journal))
                await conn.rollback()
        except _FlagLost:
            return "the flag lapsed", set()
        status, detail = await self._finish(bid, staged, journal, live, known)
        if status != "ok":
            return f"{status} {detail}".strip(), set()
        done.events, done.refused = events, refused
        done.journal_replayed, done.journal_known = int(detail), len(known)
        done.keys = len(staged.counters | staged.others | live)
        tag = self._keys.tag(bid)
        return "ok", {k for k in staged.others if _REGION_VIEW.fullmatch(k[len(tag) + 1 :])}

    async def _journaled(self, board_id: str, journal: _Staged) -> set[str]:
        """The ids of the events journaled so far, their keys added to ``journal``: the finish
        step replays them onto staging, and must be given each key they write."""
        raw: list[Any] = await self._redis.lrange(self._keys.rebuild_journal(board_id), 1, -1)
        calls = [orjson.loads(entry) for entry in raw]
        for call in calls:
            journal.add(call["keys"])
        return {orjson.loads(call["args"][6] + "}")["event_id"] for call in calls}

    async def _finish(
        self, board_id: str, staged: _Staged, journal: _Staged, live: set[str], known: set[str]
    ) -> tuple[str, str]:
        """The finish step's status and detail. An event journaled after the journal was read
        may name a key not given: the step then writes nothing, and is called again with the
        journal read again. (Such an event is not among ``known``: MySQL's snapshot was taken
        before.)"""
        for _ in range(FINISH_TRIES):
            counters = sorted(staged.counters | journal.counters)
            others = sorted((staged.others | journal.others | live) - set(counters))
            call_keys = finish_keys(self._keys, board_id, counters, others)
            status, detail = await self._redis.fcall(
                REBUILD_FINISH_FUNCTION,
                len(call_keys),
                *call_keys,
                len(counters),
                self._tokens[board_id],
                *sorted(known),
            )
            if status != "unknown":
                break
            await self._journaled(board_id, journal)
        return status, detail

    async def _replay(self, board: Board, rows: Sequence[Any], staged: _Staged) -> int:
        bid = board.board_id
        async with self._redis.pipeline(transaction=False) as pipe:
            for row in rows:
                call_keys, args = replay_call(self._keys, self._settings, board, row)
                staged.add(call_keys)
                pipe.fcall(
                    REPLAY_FUNCTION, len(call_keys), *replay_keys(self._keys, bid, call_keys), *args
                )
            statuses: list[Any] = await pipe.execute()
        refused = [s for s in statuses if s != "ok"]
        if refused:
            # An event accepted under other bounds or periods than the board has now.
            log.warning("events the board refuses now", board_id=bid, statuses=refused[:5])
        return len(refused)

    async def _existing(self, board_ids: list[str], prefix: str) -> dict[str, _Existing]:
        """What the boards hold now, from one SCAN of ``prefix``: the keys of the kinds the
        rebuild makes (those it does not make again are deleted: a user or a period MySQL does
        not know), staging a dead rebuild left, and the global views (their users are merged
        again)."""
        tags = {self._keys.tag(b): b for b in board_ids}
        found = {b: _Existing() for b in board_ids}
        async for key in self._redis.scan_iter(match=_glob_escape(prefix) + "*", count=1000):
            tag, _, suffix = key.partition("}:")
            board = tags.get(tag + "}")
            if board is None:
                continue
            if suffix.startswith("rebuild:"):
                if suffix != "rebuild:journal":
                    found[board].staging.add(key)
            elif _rebuilt_here(suffix):
                found[board].live.add(key)
            elif _GLOBAL_VIEW.fullmatch(suffix):
                found[board].global_views.add(key)
        return found

    async def _drop_staging(self, board_id: str) -> None:
        """Staging left by an attempt that did not finish (the journal is not staging)."""
        tag = self._keys.tag(board_id)
        journal = self._keys.rebuild_journal(board_id)
        batch: list[str] = []
        async for key in self._redis.scan_iter(match=_glob_escape(tag) + ":rebuild:*", count=1000):
            if key != journal:
                batch.append(key)
            if len(batch) >= 500:
                await self._redis.unlink(*batch)
                batch = []
        if batch:
            await self._redis.unlink(*batch)

    async def _mark_dirty(self, board: Board, views: set[str]) -> int:
        """Every user of the given regional and global views marked for the next merge: the
        aggregator then writes each global entry from the rebuilt regions."""
        bid, tag = board.board_id, self._keys.tag(board.board_id)
        dirty = self._keys.dirty(bid)
        marked = 0
        for key in sorted(views):
            parts = key[len(tag) + 1 :].split(":")
            # lb:<period>:<period_id>:region:<region> or lb:<period>:<period_id>:global
            period, period_id = parts[1], parts[2]
            if parts[3] == "region":
                region = parts[4]
            else:
                found: set[Any] = await self._redis.smembers(
                    self._keys.regions(bid, period, period_id)
                )
                region = min(found) if found else ""
            members: list[str] = []
            async for member, _ in self._redis.zscan_iter(key, count=1000):
                members.append(dirty_member(period, period_id, region, member))
                if len(members) >= 1000:
                    marked += await self._redis.sadd(dirty, *members)
                    members = []
            if members:
                marked += await self._redis.sadd(dirty, *members)
        return marked


class _FlagLost(Exception):
    """The rebuilding flag expired under a rebuild: journaling stopped, so it starts over."""


def _page(board_id: str, after: int) -> Any:
    """A page of the board's events in the order the log stored them: the order they were
    applied in, for the events one relay published (see docs/reliability.md)."""
    t = score_events.c
    return (
        select(
            t.id,
            t.event_id,
            t.user_id,
            t.region,
            t.team_id,
            t.display_name,
            t.value,
            t.occurred_at,
            t.accepted_at,
        )
        .where(t.board_id == board_id, t.id > after)
        .order_by(t.id)
        .limit(PAGE)
    )


async def _held(conn: AsyncConnection, board_id: str, event_ids: Iterable[str]) -> set[str]:
    """Which of ``event_ids`` the event log holds for the board."""
    wanted = sorted(event_ids)
    held: set[str] = set()
    t = score_events.c
    for start in range(0, len(wanted), ID_CHUNK):
        chunk = wanted[start : start + ID_CHUNK]
        rows = await conn.execute(
            select(t.event_id).where(t.board_id == board_id, t.event_id.in_(chunk))
        )
        held.update(row.event_id for row in rows)
    return held


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def rebuild(
    settings: LadderSettings, only: Iterable[str] = (), wait_seconds: float = 120.0
) -> list[BoardRebuild]:
    """Open MySQL and Redis (loading the function library, which a Redis that lost its data
    lacks too) and rebuild."""
    async with (
        open_engine(settings.mysql_url) as engine,
        open_redis(settings.redis_url, load_functions=True) as redis,
    ):
        rebuilder = Rebuilder(engine, redis, Keys(settings.key_prefix), settings, wait_seconds)
        return await rebuilder.run(only)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m services.history.rebuild",
        description="Recreate every board in Redis exactly from the history database.",
    )
    parser.add_argument("--board", action="append", default=[], help="only this board (repeatable)")
    parser.add_argument(
        "--wait",
        type=float,
        default=120.0,
        help="seconds to wait for history to store events Redis applied already (120)",
    )
    options = parser.parse_args(argv)
    settings = load_settings()
    configure("rebuild", settings.log_level)
    try:
        done = asyncio.run(rebuild(settings, options.board, options.wait))
    except RebuildFailed as exc:
        log.error("rebuild failed", error=str(exc))
        sys.exit(1)
    for board in done:
        print(
            f"{board.board_id}: {board.events} events, {board.journal_replayed} written "
            f"meanwhile (and {board.journal_known} more already in MySQL), {board.keys} keys, "
            f"{board.dirty} users to merge, {board.attempts} attempt(s), {board.seconds:.1f} s"
        )


if __name__ == "__main__":
    main()
