"""A season's keys after its board's schedule changes (docs/api.md section 3).

A season's keys are named by its id, its start, alone (shared/keys.py), and a key gets its
expiry when it is made (the write's ``expire_made``, the merge's ``EXPIREAT NX``). A season of a
new schedule that starts at the same minute as a season of the schedule before (every firing of
``*/5 * * * *`` is one of ``* * * * *``) therefore writes into the keys that season made, and
would expire with them: two minutes into an hourly season kept twice, after minute seasons kept
twice. :func:`raise_expiry` gives such keys the expiry of the new schedule's season instead; keys
named by a season's end as well would keep the two seasons apart.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from redis.asyncio import Redis

from shared.boards import Board
from shared.keys import Keys
from shared.periods import PeriodWindow, expire_at, window_at, windows_before

# The seasons' keys of a board, after its hash tag: each kind of key named by a period id
# (shared/keys.py: views and their sets, regions, players, event counts, tops, MVP sets) holds
# ``<kind>:season:<id>``; other keys (a rebuild's staging copies, a close's claim) are left alone.
SEASON_KEYS = "*:season:*"
KINDS = ("lb", "regions", "players", "events", "top", "mvp")


def written_seasons(board: Board, now: datetime, ahead: float) -> list[PeriodWindow]:
    """The seasons of ``board``'s schedule that writes may reach at ``now``: the current one,
    the one before it (late events still write it), and the one an event up to ``ahead``
    seconds ahead of time falls in."""
    tz, schedule = board.timezone, board.schedule
    current = window_at("season", now, tz, schedule)
    found = [current, *windows_before(current, tz, 1, schedule)]
    coming = window_at("season", now + timedelta(seconds=ahead), tz, schedule)
    return found if coming in found else [coming, *found]


def _expiries(board: Board, now: datetime, ahead: float) -> dict[str, int | None]:
    """Each of the :func:`written_seasons` id -> when its keys expire (None: never)."""
    retention = board.retention.of("season")
    return {
        season.period_id: expire_at(season, board.timezone, retention, board.schedule)
        for season in written_seasons(board, now, ahead)
    }


def season_of(key: str, tag: str, ids: dict[str, Any]) -> str | None:
    """Which of ``ids`` names the season key ``key`` of the board of hash tag ``tag`` (None:
    none, or no key of a season)."""
    kind, _, rest = key.removeprefix(tag + ":").partition(":")
    if not key.startswith(tag + ":") or kind not in KINDS or not rest.startswith("season:"):
        return None
    # A season id holds one ":" (2026-12-04T18:00): the id is the two parts after the period.
    season_id = ":".join(rest.split(":")[1:3])
    return season_id if season_id in ids else None


async def raise_expiry(redis: Redis, keys: Keys, board: Board, now: datetime, ahead: float) -> int:
    """Raise the expiry of the existing keys of ``board``'s :func:`written_seasons` to what its
    schedule keeps each season (``EXPIREAT GT``: never lowered, and a key without one stays so;
    ``PERSIST`` where the season is kept forever). Call after the schedule changed, with the
    new definition stored. A ``SCAN`` of the keyspace, as a change of schedule is rare; the
    expiries a thread's work (a walk of up to 10,000 firings a season). Returns how many keys
    were raised."""
    if board.schedule is None:
        return 0
    expiries = await asyncio.to_thread(_expiries, board, now, ahead)
    tag = keys.tag(board.board_id)
    found: list[tuple[str, int | None]] = []
    match = keys.board_match(board.board_id, SEASON_KEYS)
    async for key in redis.scan_iter(match=match, count=1000):
        season_id = season_of(key, tag, expiries)
        if season_id is not None:
            found.append((key, expiries[season_id]))
    if not found:
        return 0
    async with redis.pipeline(transaction=False) as pipe:
        for key, at in found:
            if at is None:
                pipe.persist(key)
            else:
                pipe.expireat(key, at, gt=True)
        replies: list[Any] = await pipe.execute()
    return sum(1 for reply in replies if reply)
