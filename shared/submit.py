"""The arguments of one ``submit()`` call (``shared/ladder.lua``): what one accepted event writes.

Built in one place for the API's write path (:mod:`services.api.writes`) and for the rebuild's
replay of a stored event (:mod:`services.history.rebuild`), so that a rebuilt board is made of
exactly the calls that made the live one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime

import orjson

from shared.boards import Board
from shared.events import rfc3339
from shared.keys import Keys
from shared.periods import Period, PeriodWindow, expire_at, window_at
from shared.ranking import ENCODINGS, tick

# The layout of submit()'s keys (KEYS_BEFORE and KEYS_PER_PERIOD in shared/ladder.lua): six
# keys of the event, then seven a period, the period's event counter last.
KEYS_BEFORE = 6
KEYS_PER_PERIOD = 7


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


# The window of each (period, timezone) last seen: almost every write falls in the current one,
# and working a window out (zoneinfo, calendar) is a good part of a write's CPU time otherwise.
_windows: dict[tuple[Period, str], PeriodWindow] = {}


def current_window(period: Period, moment: datetime, timezone: str) -> PeriodWindow:
    """``window_at``, remembering the last window of each period and timezone."""
    window = _windows.get((period, timezone))
    if window is None or moment < window.start or (window.end is not None and moment >= window.end):
        window = _windows[(period, timezone)] = window_at(period, moment, timezone)
    return window


@functools.lru_cache(maxsize=1024)
def expiry_of(window: PeriodWindow, timezone: str, retention: int | None) -> int:
    """When a period's keys expire (0: never); the same for every write of the period."""
    return expire_at(window, timezone, retention) or 0


def submit_call(
    keys: Keys,
    board: Board,
    event: SubmitEvent,
    *,
    body_hash: str,
    idempotency_ttl: int,
    outbox_max: int,
    feed_length: int,
) -> tuple[list[str], list[str | int]]:
    """The keys and arguments of ``submit()`` for ``event`` on ``board``."""
    record = {
        "event_id": event.event_id,
        "board_id": board.board_id,
        "user_id": event.user_id,
        "region": event.region,
        "team_id": event.team_id,
        "display_name": event.display_name,
        "value": event.value,
        "occurred_at": rfc3339(event.occurred_at),
        "accepted_at": rfc3339(event.accepted_at),
    }
    bid = board.board_id
    call_keys = [
        keys.idempotency(bid, event.event_id),
        keys.outbox(bid),
        keys.names(bid),
        keys.feed(bid),
        keys.user_regions(bid, event.user_id),
        keys.user_team(bid),
    ]
    period_args: list[str | int] = []
    for period in board.periods:
        window = current_window(period, event.occurred_at, board.timezone)
        enc = ENCODINGS[period]
        view = keys.region_view(bid, period, window.period_id, event.region)
        teams = keys.teams_view(bid, period, window.period_id)
        call_keys += [
            view,
            keys.distinct(view),
            keys.regions(bid, period, window.period_id),
            teams,
            keys.distinct(teams),
            keys.players(bid, period, window.period_id),
            keys.event_count(bid, period, window.period_id),
        ]
        period_args += [
            period,
            window.period_id,
            enc.scale,
            tick(window, event.occurred_at),
            enc.max_score,
            expiry_of(window, board.timezone, board.retention.of(period)),
        ]
    args: list[str | int] = [
        body_hash,
        board.operator,
        event.value,
        event.user_id,
        event.region,
        event.display_name or "",
        # Without its closing brace: submit() appends the periods' results to the record.
        orjson.dumps(record).decode()[:-1],
        len(board.periods),
        idempotency_ttl,
        outbox_max,
        ",".join(str(t) for t in board.notify_top),
        "1" if board.descending else "0",
        feed_length,
        event.team_id or "",
        *period_args,
    ]
    return call_keys, args
