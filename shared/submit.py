"""The arguments of one ``submit()`` call (``shared/lua/write.lua``): what one accepted event
writes.

Built in one place for the API's write path (:mod:`services.api.write.submit`) and for the
rebuild's replay of a stored event (:mod:`services.rebuild.staging`), so that a rebuilt board is
made of exactly the calls that made the live one; the keys a replay writes instead are worked out
here too.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson

from shared.boards import Board
from shared.events import ScoreAccepted, rfc3339
from shared.keys import Keys
from shared.periods import (
    Period,
    PeriodIdError,
    PeriodWindow,
    expire_at,
    window_at,
    window_of,
)
from shared.ranking import MAX_SCORE, reached_ms, sub_part, tie_key

# The journaled layout of submit()'s keys (the same names in shared/lua/write.lua and
# rebuild.lua): ten keys of the event, the first six the write's own (idempotency record, the
# record of the layout before, outbox, rebuild flag, journal and newest event), then nine a
# period, the period's event counter last, then the board's hidden users (a replay reads its
# staging copy, which the rebuild fills from MySQL). The derived views' keys (feed, user regions
# and team, each period's players and event count) are named though the write does not touch
# them, and each period's regions set though the write adds to it only for a user new to the
# regional board: a journaled call is replayed whole, the write then the derive step
# (shared/lua/rebuild.lua). The lean layout, which the API sends first, names only the keys the
# write touches (write.lua); it is refused while the board is being rebuilt.
WRITE_OWN_KEYS = 6
KEYS_BEFORE = 10
KEYS_PER_PERIOD = 9


@dataclass(frozen=True, slots=True)
class SubmitEvent:
    """One event as the write function records it."""

    event_id: str
    user_id: str
    region: str
    team_id: str | None
    display_name: str | None
    value: int
    occurred_at: datetime
    accepted_at: datetime
    subscore: int | None = None
    # The metadata object as compact JSON text, kept byte for byte (None: none).
    metadata: str | None = None


# The window of each (period, timezone) last seen: almost every write falls in the current one,
# and working a window out (zoneinfo, calendar) is a good part of a write's CPU time otherwise.
_windows: dict[tuple[Period, str, str | None], PeriodWindow] = {}

# How long the keys of a season of a schedule the board no longer has are kept from the moment
# a step meets them (its end cannot be worked out any more): a day.
FORMER_SEASON_TTL = 86_400


def current_window(
    period: Period, moment: datetime, timezone: str, schedule: str | None = None
) -> PeriodWindow:
    """``window_at``, remembering the last window of each period, timezone and schedule."""
    window = _windows.get((period, timezone, schedule))
    if window is None or moment < window.start or (window.end is not None and moment >= window.end):
        window = window_at(period, moment, timezone, schedule)
        _windows[(period, timezone, schedule)] = window
    return window


@functools.lru_cache(maxsize=1024)
def expiry_of(
    window: PeriodWindow, timezone: str, retention: int | None, schedule: str | None = None
) -> int:
    """When a period's keys expire (0: never); the same for every write of the period."""
    return expire_at(window, timezone, retention, schedule) or 0


@functools.lru_cache(maxsize=1024)
def _period_expiry(
    timezone: str, retention: int | None, period: Period, period_id: str, schedule: str | None
) -> int:
    window = window_of(period, period_id, timezone, schedule)
    return expiry_of(window, timezone, retention, schedule)


def period_expiry(
    timezone: str,
    retention: int | None,
    period: Period,
    period_id: str,
    schedule: str | None = None,
) -> int:
    """:func:`expiry_of` the period named by its id: the aggregator's steps ask it of every
    event's periods, and a handful of periods are live at a time. A season of a schedule the
    board no longer has (changed meanwhile) is kept ``FORMER_SEASON_TTL`` from now."""
    try:
        return _period_expiry(timezone, retention, period, period_id, schedule)
    except PeriodIdError:
        return int(time.time()) + FORMER_SEASON_TTL


def board_period_expiry(board: Board, period: Period, period_id: str) -> int:
    """:func:`period_expiry` of one of ``board``'s periods (0: never)."""
    return period_expiry(
        board.timezone, board.retention.of(period), period, period_id, board.schedule
    )


# A write's keys but its idempotency records are the same for every write of the board (and,
# for a period's, of the region in that period): built once, not per request.
@functools.lru_cache(maxsize=256)
def _board_keys(keys: Keys, board_id: str) -> tuple[str, str, str, str, str, str, str, str]:
    """Outbox, rebuild flag, rebuild journal, newest event, names, feed, users' regions,
    user-team: in a journaled submit()'s order."""
    return (
        keys.outbox(board_id),
        keys.rebuilding(board_id),
        keys.rebuild_journal(board_id),
        keys.newest_event(board_id),
        keys.names(board_id),
        keys.feed(board_id),
        keys.user_regions(board_id),
        keys.user_team(board_id),
    )


@functools.lru_cache(maxsize=4096)
def _period_keys(
    keys: Keys, board_id: str, period: Period, period_id: str, region: str
) -> tuple[str, ...]:
    """The ``KEYS_PER_PERIOD`` keys of one period of a write, the event counter last."""
    view = keys.region_view(board_id, period, period_id, region)
    teams = keys.teams_view(board_id, period, period_id)
    return (
        view,
        keys.distinct(view),
        keys.ties(view),
        keys.regions(board_id, period, period_id),
        teams,
        keys.distinct(teams),
        keys.ties(teams),
        keys.players(board_id, period, period_id),
        keys.event_count(board_id, period, period_id),
    )


@functools.lru_cache(maxsize=256)
def _lean_board_keys(keys: Keys, board_id: str) -> tuple[str, str, str, str]:
    """Those of :func:`_board_keys` a lean submit() is given: outbox, rebuild flag, newest event,
    names."""
    outbox, rebuilding, _, newest, names, *_ = _board_keys(keys, board_id)
    return outbox, rebuilding, newest, names


@functools.lru_cache(maxsize=4096)
def _lean_period_keys(
    keys: Keys, board_id: str, period: Period, period_id: str, region: str
) -> tuple[str, str, str]:
    """Those of :func:`_period_keys` a lean write is given: the regional board, its tie keys and
    the period's regions set (which a user's first score on the regional board adds to)."""
    view, _, ties, regions, *_ = _period_keys(keys, board_id, period, period_id, region)
    return view, ties, regions


def _record(board_id: str, event: SubmitEvent) -> dict[str, object]:
    """The event as the outbox, the feed and the idempotency record keep it."""
    record: dict[str, object] = {
        "event_id": event.event_id,
        "board_id": board_id,
        "user_id": event.user_id,
        "region": event.region,
        "team_id": event.team_id,
        "display_name": event.display_name,
        "value": event.value,
        "occurred_at": rfc3339(event.occurred_at),
        "accepted_at": rfc3339(event.accepted_at),
    }
    # Only where given, so that the outbox entries of boards without them stay as they were.
    if event.subscore is not None:
        record["subscore"] = event.subscore
    if event.metadata is not None:
        record["metadata"] = orjson.Fragment(event.metadata)
    return record


def feed_entry(event: ScoreAccepted) -> str:
    """The event as the feed keeps it (the aggregator's derive step pushes it): the very JSON
    the write was given (``_record``), so that a live feed and a rebuilt one (replayed from the
    write's arguments, shared/lua/rebuild.lua) hold the same bytes. The metadata was compact
    JSON by orjson (services/api/write/models.py), which orjson writes back unchanged."""
    metadata = None if event.metadata is None else orjson.dumps(event.metadata).decode()
    stored = SubmitEvent(
        event.event_id,
        event.user_id,
        event.region,
        event.team_id,
        event.display_name,
        event.value,
        event.occurred_at,
        event.accepted_at,
        subscore=event.subscore,
        metadata=metadata,
    )
    return orjson.dumps(_record(event.board_id, stored)).decode()


def submit_call(
    keys: Keys,
    board: Board,
    event: SubmitEvent,
    *,
    body_hash: str,
    idempotency_ttl: int,
    outbox_max: int,
    feed_length: int,
    journaled: bool = True,
    periods: Sequence[tuple[Period, str, int]] | None = None,
) -> tuple[list[str], list[str | int]]:
    """The keys and arguments of ``submit()`` for ``event`` on ``board``: its keys in the
    journaled layout, or in the lean one (``journaled=False``); the arguments are the same.

    The event goes into the board's periods at its ``occurred_at``, or into ``periods``
    (period, period id, expire-at) where given: a replay's, the periods the live write chose."""
    record = _record(board.board_id, event)
    bid = board.board_id
    call_keys = [
        keys.idempotency(bid, event.event_id, event.user_id),
        keys.legacy_idempotency(bid, event.event_id),
    ]
    period_keys: Callable[[Keys, str, Period, str, str], tuple[str, ...]] = _period_keys
    if journaled:
        call_keys += _board_keys(keys, bid)
    else:
        call_keys += _lean_board_keys(keys, bid)
        period_keys = _lean_period_keys
    period_args: list[str | int] = []
    if periods is None:
        for period in board.periods:
            window = current_window(period, event.occurred_at, board.timezone, board.schedule)
            call_keys += period_keys(keys, bid, period, window.period_id, event.region)
            period_args += [
                period,
                window.period_id,
                expiry_of(window, board.timezone, board.retention.of(period), board.schedule),
            ]
    else:
        for period, period_id, expiry in periods:
            call_keys += period_keys(keys, bid, period, period_id, event.region)
            period_args += [period, period_id, expiry]
    args: list[str | int] = [
        body_hash,
        board.operator,
        event.value,
        event.user_id,
        event.region,
        event.display_name or "",
        # Without its closing brace: submit() appends the periods' results to the record.
        orjson.dumps(record).decode()[:-1],
        len(board.periods if periods is None else periods),
        idempotency_ttl,
        outbox_max,
        ",".join(str(t) for t in board.notify_top),
        "1" if board.descending else "0",
        feed_length,
        event.team_id or "",
        # The event's tie key: its subscore part, then its own time. The write gives each
        # period's entry the reach time its operator takes from it and the entry's (write.lua
        # new_score(): by when events happened, not by the order they come in).
        tie_key(reached_ms(event.occurred_at), sub_part(event.subscore, board.subscore_order)),
        MAX_SCORE,
        event.metadata or "",
        # How the write turns a previous entry's subscore part back into its subscore (the
        # outbox entry's ``previous_subscore``).
        board.subscore_order or "",
        *period_args,
    ]
    # Last, the board's hidden users: a hidden user's entries stay records alone (write.lua).
    call_keys.append(keys.hidden(bid))
    return call_keys, args


# -- the rebuild's replay of a call ----------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _stored_expiry(
    timezone: str, retention: int | None, period: Period, period_id: str, schedule: str | None
) -> int | None:
    """``_period_expiry``, or None for a period the board no longer tells the window of."""
    try:
        return _period_expiry(timezone, retention, period, period_id, schedule)
    except PeriodIdError:
        return None


def stored_periods(
    board: Board, stored: Sequence[tuple[Period, str]]
) -> tuple[list[tuple[Period, str, int]], list[int]]:
    """The periods a replay writes a stored event to: those its live write chose (``stored``,
    shared/events.py parse_period_ids), each with its expire-at on the board as it is now; and
    the indexes of those whose window the board no longer tells (a season of a schedule it no
    longer has), kept ``FORMER_SEASON_TTL`` from now here, as :func:`period_expiry` keeps them."""
    periods: list[tuple[Period, str, int]] = []
    former: list[int] = []
    tz, schedule = board.timezone, board.schedule
    for i, (period, period_id) in enumerate(stored):
        expiry = _stored_expiry(tz, board.retention.of(period), period, period_id, schedule)
        if expiry is None:
            former.append(i)
            expiry = int(time.time()) + FORMER_SEASON_TTL
        periods.append((period, period_id, expiry))
    return periods, former


def period_call_keys(call_keys: Sequence[str], i: int) -> Sequence[str]:
    """The keys of a journaled call's ``i``-th period (0-based)."""
    start = KEYS_BEFORE + i * KEYS_PER_PERIOD
    return call_keys[start : start + KEYS_PER_PERIOD]


def replayed_keys(call_keys: Sequence[str]) -> tuple[list[str], list[str]]:
    """The live keys whose staging copies a replay of the call writes: its event counters, and
    the others (not the write's own keys, for which a replay gets scratch keys)."""
    counters: list[str] = []
    others: list[str] = []
    for i, key in enumerate(call_keys[WRITE_OWN_KEYS:], start=WRITE_OWN_KEYS + 1):
        is_counter = i > KEYS_BEFORE and (i - KEYS_BEFORE) % KEYS_PER_PERIOD == 0
        (counters if is_counter else others).append(key)
    return counters, others


def replay_keys(keys: Keys, board_id: str, call_keys: Sequence[str]) -> list[str]:
    """The keys of ``ladder_replay_v10`` for a call: scratch keys, then the staging copies."""
    staged = [keys.staged(board_id, key) for key in call_keys[WRITE_OWN_KEYS:]]
    return keys.replay_scratch(board_id) + staged


def finish_keys(
    keys: Keys,
    board_id: str,
    counters: Sequence[str],
    others: Sequence[str],
    records: Sequence[str],
) -> list[str]:
    """The keys of ``ladder_rebuild_finish_v10``: flag, journal, the replay's scratch keys, the
    records of the journal's events, then each live key the rebuild replaces with its staging
    copy, the event counters first."""
    pairs = [k for key in (*counters, *others) for k in (key, keys.staged(board_id, key))]
    return [
        keys.rebuilding(board_id),
        keys.rebuild_journal(board_id),
        *keys.replay_scratch(board_id),
        *records,
        *pairs,
    ]
