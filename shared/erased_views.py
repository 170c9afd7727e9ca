"""An erased user taken out of one board's Redis keys (docs/api.md section 8b), by whichever side
finds them: the erasure's passes (services/api/eraser.py), and the aggregator for a batch it
applied while the erasure was being recorded (services/aggregator/late_erasures.py). One
``ladder_erase_user_v3`` call (shared/lua/erase.lua): the user's entry in every view of every
period the board may keep and of those the caller found, with its records and distinct pairs;
its name, team, regions, badges, rate bucket, feed and hot entries, MVP contributions and the
newest event if it names the user. Idempotent: a call again removes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis

from shared.boards import Board
from shared.functions import ERASE_USER_FUNCTION
from shared.keys import Keys, dirty_member, regions_of
from shared.live_maths import HOT_WINDOWS
from shared.periods import window_at, windows_before

UNLINK_BATCH = 500


@dataclass(slots=True)
class Found:
    """What is known to hold the user on one board beyond what the definition keeps: its views'
    periods and regions, and its MVP teams' member sets."""

    windows: set[tuple[str, str]] = field(default_factory=set)
    regions: set[str] = field(default_factory=set)
    # MVP teams' member sets: a user who changed teams in a period is in several.
    team_sets: set[str] = field(default_factory=set)


def kept_windows(board: Board, future: timedelta) -> list[tuple[str, str]]:
    """Every (period, period_id) the board may still keep, the one just begun included (``future``
    past now: an event may have occurred that far ahead)."""
    latest = datetime.now(UTC) + future
    found: list[tuple[str, str]] = []
    for period in board.periods:
        window = window_at(period, latest, board.timezone, board.schedule)
        found.append((period, window.period_id))
        if window.end is None:
            continue
        retention = (board.retention.of(period) or 0) + 1
        for before in windows_before(window, board.timezone, retention, board.schedule):
            found.append((period, before.period_id))
    return found


async def _regions_and_teams(
    redis: Redis, keys: Keys, board: Board, user_id: str, windows: list[tuple[str, str]]
) -> tuple[set[str], set[str]]:
    """The regions and MVP teams the board's keys name for the user."""
    bid = board.board_id
    async with redis.pipeline(transaction=False) as pipe:
        pipe.smembers(keys.legacy_user_regions(bid, user_id))
        pipe.hget(keys.user_team(bid), user_id)
        pipe.hget(keys.user_regions(bid), user_id)
        for period, period_id in windows:
            pipe.smembers(keys.regions(bid, period, period_id))
            pipe.hget(keys.member_team(bid, period, period_id), user_id)
        found: list[Any] = await pipe.execute()
    regions: set[str] = set(found[0]) | set(regions_of(found[2]))
    regions |= set(board.regions or ())
    teams: set[str] = {found[1]} if found[1] else set()
    for i in range(len(windows)):
        regions |= set(found[3 + 2 * i])
        latest_team = found[4 + 2 * i]
        if latest_team:
            teams.add(latest_team.partition("|")[2])
    return regions, teams


async def erase_from_board(
    redis: Redis, keys: Keys, board: Board, user_id: str, seen: Found, future: timedelta
) -> int:
    """The user out of the board's keys; returns the view entries removed."""
    bid = board.board_id
    kept = set(kept_windows(board, future))
    windows = sorted(kept | seen.windows)
    regions, teams = await _regions_and_teams(redis, keys, board, user_id, windows)
    regions |= seen.regions
    call_keys: list[str] = [
        keys.names(bid),
        keys.user_team(bid),
        keys.feed(bid),
        keys.badges(bid, user_id),
        keys.legacy_user_regions(bid, user_id),
        keys.hot_events(bid),
        keys.newest_event(bid),
        keys.rate_bucket(bid, "user", user_id),
        keys.dirty(bid),
        keys.mvp_dirty(bid),
    ]
    marks: list[str] = []
    tops: list[str] = []
    for period, period_id in windows:
        scopes = [("global", "")] + [(f"region:{r}", r) for r in sorted(regions)]
        for scope, region in scopes:
            view = keys.board_view(bid, period, period_id, scope)
            call_keys += [view, keys.distinct(view), keys.distinct_building(view)]
            call_keys.append(keys.ties(view))
            # A period the definition no longer keeps is not merged: its entry goes, no mark.
            merged = bool(region) and (period, period_id) in kept
            marks.append(dirty_member(period, period_id, region, user_id) if merged else "")
            tops.append(keys.last_top(bid, period, period_id, scope))
    hashes = [keys.user_regions(bid)] + [keys.member_team(bid, p, pid) for p, pid in windows]
    hot = [key for w in HOT_WINDOWS for key in (keys.hot_window(bid, w), keys.hot_rank(bid, w))]
    members = sorted(
        {keys.team_members(bid, p, pid, team) for p, pid in windows for team in teams}
        | seen.team_sets
    )
    call_keys += hashes + hot + members
    # Only an incr board keeps MVPs: another's marks would never be taken.
    incr = board.operator == "incr"
    mvp_marks = [f"{p}|{pid}" for p, pid in windows if incr and (p, pid) in kept]
    args: list[str | int] = [user_id, len(marks), len(hashes), len(HOT_WINDOWS), len(members)]
    args += [*marks, len(mvp_marks), *mvp_marks]
    removed = int(await redis.fcall(ERASE_USER_FUNCTION, len(call_keys), *call_keys, *args))
    # The top 10 last pushed of each view: it may name the user (a global view of a period
    # no longer kept is never merged again to replace it); the next push of each view
    # compares with nothing and sends its top afresh.
    for start in range(0, len(tops), UNLINK_BATCH):
        await redis.unlink(*tops[start : start + UNLINK_BATCH])
    return removed
