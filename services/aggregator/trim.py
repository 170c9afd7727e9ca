"""The users' hashes of boards that keep no all-time period, trimmed (docs/architecture.md,
"Periods"): a board's names, users' regions and users' teams (``{P:B}:names``,
``{P:B}:user-regions``, ``{P:B}:user-team``) belong to no period and never expire, and on such a
board they would outlive every period they were written for. Every ``LADDER_TRIM_INTERVAL``
seconds (an hour) the aggregator walks each such board's three hashes, ``HSCAN`` a chunk at a
time, and drops the fields of the users that no period the board still keeps holds: one
``ladder_trim_users_v1`` call a chunk (shared/lua/trim.lua) decides and deletes, so that no write
comes between. A board that keeps ``alltime`` is left alone: every user it ever had is in its
all-time view. Where several aggregators run, a board is swept by one of them, the holder of its
trim lease (``{P:B}:trimlease``, shared/lease.py): taken at a board's sweep, renewed at the next,
and lasting two intervals, so that a dead holder's boards are swept by another within three.

The periods a call looks in are each of the board's kinds' current one (at now plus the future
tolerance), the next, and the ``retention`` before them and two more: the ones a read may name
(services/api/reads/views.py refuses older ones) and those a late write may still make. Of
these, a period whose keys are all gone and which no write may make any more (it ended more
than the allowed lateness and five minutes ago) is left out. The regions each period holds are
read before the calls and given with them; a call that finds a period's regions set changed
since deletes nothing, and the regions are read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis

from shared import service
from shared.boards import Board, BoardCatalog
from shared.functions import TRIM_USERS_FUNCTION
from shared.keys import Keys, dirty_member
from shared.lease import Lease, give_up
from shared.periods import PeriodWindow, window_at, windows_before

log = structlog.get_logger(__name__)

TRIMMED = Counter(
    "ladder_aggregator_trimmed_fields_total",
    "Fields of boards' names, users' regions and users' teams trimmed (users no kept period holds)",
)

CHUNK = 300
"""The most users a trim call looks at."""

WORK = 10_000
"""The most lookups a trim call makes: a user costs one a period, three a region of it (its
regional records, its marks in the dirty and merging sets), and one (the hidden set)."""

MARGIN = 2
"""Periods a trim looks in beyond a kind's retention."""

LATE_MARGIN = 300.0
"""Seconds past the allowed lateness during which a period without keys is still looked in."""

REREAD = 10.0
"""Seconds a reading of a board's periods and their regions serves its sweep's calls."""

ATTEMPTS = 3
"""Calls of one chunk that may find a regions set changed before the board waits a sweep."""

_SLOT = "\0"


@dataclass(frozen=True, slots=True)
class Held:
    """A period a trim call looks in: its kind, id, and the regions its regions set held."""

    period: str
    period_id: str
    regions: tuple[str, ...]


class RegionsMoved(RuntimeError):
    """A board's periods' regions kept changing under its trim calls."""


def _running(board: Board, now: datetime, future: float) -> list[PeriodWindow]:
    """The period of each of ``board``'s kinds running at ``now`` plus ``future`` (all-time
    aside)."""
    at = now + timedelta(seconds=future)
    found = [window_at(period, at, board.timezone, board.schedule) for period in board.periods]
    return [w for w in found if w.end is not None]


def heads(board: Board, now: datetime, future: float) -> list[PeriodWindow]:
    """For each kind of ``board``'s periods, the one running at ``now`` plus ``future`` and the
    next; and the all-time period, whose view a board that dropped ``alltime`` keeps (it never
    expires), so that its users keep their fields should the board take ``alltime`` back."""
    found = [window_at("alltime", now, board.timezone, board.schedule)]
    for current in _running(board, now, future):
        assert current.end is not None
        found += [current, window_at(current.period, current.end, board.timezone, board.schedule)]
    return found


def candidates(board: Board, now: datetime, future: float) -> list[PeriodWindow]:
    """Every period of ``board`` a trim looks in, if it still has keys: :func:`heads`, and for
    each kind the ``retention`` plus :data:`MARGIN` before the one running. A walk of up to
    10,000 seasons: most of a second for a board of minute seasons kept that long."""
    found = heads(board, now, future)
    for current in _running(board, now, future):
        back = (board.retention.of(current.period) or 0) + MARGIN
        found.extend(windows_before(current, board.timezone, back, board.schedule))
    return found


class Trimmer:
    """Trims the users' hashes of every board without ``alltime``, a chunk a Redis call."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        lateness: float,
        future: float,
        chunk: int = CHUNK,
        work: int = WORK,
        lease: Lease | None = None,
    ) -> None:
        self._redis = redis
        self.lease = lease
        self._keys = keys
        self._lateness = lateness
        self._future = future
        self._chunk = chunk
        self._work = work

    async def sweep(self, boards: list[Board], stop: asyncio.Event | None = None) -> None:
        """Trim each board that keeps no ``alltime`` in turn, until ``stop`` is set; with a
        lease, only the boards whose trim lease this aggregator holds or takes."""
        if self.lease is not None:
            self.lease.keep_only(board.board_id for board in boards)
        for board in boards:
            if stop is not None and stop.is_set():
                return
            if "alltime" in board.periods:
                continue
            if self.lease is not None and not await self.lease.hold(board.board_id):
                continue
            with service.board_step(board, "trim"):
                await self.trim_board(board, stop)

    async def held(
        self, board: Board, windows: list[PeriodWindow] | None = None, now: datetime | None = None
    ) -> list[Held]:
        """The periods a trim call looks in, with their regions: of ``windows`` (those of
        :func:`candidates`, worked out once a board's sweep) and of :func:`heads` at ``now``,
        those with keys, and those a write may still make (ended less than the allowed lateness
        and :data:`LATE_MARGIN` ago, or not yet; the all-time period never, on such a board)."""
        now = now or datetime.now(UTC)
        bid = board.board_id
        if windows is None:
            windows = candidates(board, now, self._future)
        windows = heads(board, now, self._future) + windows
        async with self._redis.pipeline(transaction=False) as pipe:
            for w in windows:
                pipe.smembers(self._keys.regions(bid, w.period, w.period_id))
                pipe.exists(self._keys.ties(self._keys.global_view(bid, w.period, w.period_id)))
            replies: list[Any] = await pipe.execute()
        open_after = now - timedelta(seconds=self._lateness + LATE_MARGIN)
        found: dict[tuple[str, str], Held] = {}
        for i, w in enumerate(windows):
            regions, merged = replies[2 * i], replies[2 * i + 1]
            writable = w.end is not None and w.end >= open_after
            if regions or merged or writable:
                found[(w.period, w.period_id)] = Held(w.period, w.period_id, tuple(sorted(regions)))
        return list(found.values())

    async def trim_board(self, board: Board, stop: asyncio.Event | None = None) -> int:
        """Walk the board's three hashes, a chunk at a time (``stop`` ends the walk at the next
        chunk); the fields trimmed."""
        bid = board.board_id
        # Off the event loop: a walk of many seasons takes most of a second.
        windows = await asyncio.to_thread(candidates, board, datetime.now(UTC), self._future)
        held, read_at = await self.held(board, windows), time.monotonic()
        trimmed = users = 0
        for hashed in (
            self._keys.user_regions(bid),
            self._keys.names(bid),
            self._keys.user_team(bid),
        ):
            cursor: int = 0
            while True:
                cursor, fields = await self._redis.hscan(hashed, cursor, count=self._chunk)
                # The user-team hash holds each user's team stamp too, '@' and the user id.
                chunk = sorted({_text(f).removeprefix("@") for f in fields})
                while chunk:
                    if time.monotonic() - read_at > REREAD:
                        held, read_at = await self.held(board, windows), time.monotonic()
                    part, chunk = chunk[: self._per_call(held)], chunk[self._per_call(held) :]
                    gone, deleted, held = await self._trim(board, windows, held, part)
                    users, trimmed = users + gone, trimmed + deleted
                    TRIMMED.inc(deleted)
                if cursor == 0 or (stop is not None and stop.is_set()):
                    break
        if trimmed:
            log.info("users trimmed", board_id=bid, users=users, fields=trimmed)
        return trimmed

    def _per_call(self, held: list[Held]) -> int:
        """The users a call looks at: :data:`CHUNK`, fewer where its periods cost more."""
        cost = 1 + sum(1 + 3 * len(h.regions) for h in held)
        return max(1, min(self._chunk, self._work // cost))

    async def _trim(
        self, board: Board, windows: list[PeriodWindow], held: list[Held], users: list[str]
    ) -> tuple[int, int, list[Held]]:
        """One chunk trimmed: (users trimmed, fields deleted, the periods as last read), the
        periods read again where a call found a regions set changed."""
        for _ in range(ATTEMPTS):
            call_keys, args = self.call(board, held, users)
            moved, gone, deleted = await self._redis.fcall(
                TRIM_USERS_FUNCTION, len(call_keys), *call_keys, *args
            )
            if not int(moved):
                return int(gone), int(deleted), held
            held = await self.held(board, windows)
        raise RegionsMoved(f"board {board.board_id!r}: its periods' regions kept changing")

    def call(
        self, board: Board, held: list[Held], users: list[str]
    ) -> tuple[list[str], list[str | int]]:
        """The keys and arguments of a trim call (shared/lua/trim.lua says what each is)."""
        keys, bid = self._keys, board.board_id
        call_keys = [
            keys.names(bid),
            keys.user_regions(bid),
            keys.user_team(bid),
            keys.hidden(bid),
            keys.dirty(bid),
            keys.dirty_merging(bid),
        ]
        args: list[str | int] = [len(held)]
        for h in held:
            call_keys.append(keys.ties(keys.global_view(bid, h.period, h.period_id)))
            call_keys.append(keys.regions(bid, h.period, h.period_id))
            call_keys += [
                keys.ties(keys.region_view(bid, h.period, h.period_id, r)) for r in h.regions
            ]
            prefix, _, separator = dirty_member(h.period, h.period_id, _SLOT, "").partition(_SLOT)
            args += [len(h.regions), prefix, separator, *h.regions]
        return call_keys, [*args, *users]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def until_stopped(
    trimmer: Trimmer, catalog: BoardCatalog, interval: float, stop: asyncio.Event
) -> None:
    """A sweep of every board each ``interval`` seconds until ``stop`` (a sweep under way ends
    at its next chunk), the first at a random moment of the first interval: aggregators started
    together sweep apart, and one restarted more often than the interval still sweeps. A sweep
    that fails is logged; the next one starts over. Once stopped, the trim leases are given up,
    so that another aggregator sweeps those boards at its next sweep."""
    wait = random.uniform(0, interval)
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        if stop.is_set():
            if trimmer.lease is not None:
                await give_up(trimmer.lease)
            return
        try:
            await trimmer.sweep(await catalog.all(), stop)
        except Exception:
            log.exception("trim sweep failed; retrying next interval")
        wait = interval
