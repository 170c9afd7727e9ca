"""Which ranking a read names: a board's scope in one period (docs/api.md section 5).

Every scope but ``friends`` is one sorted set. A friends scope is the owner and its friends
ranked on the global view (:mod:`services.api.reads.friends`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from services.api.auth import Principal
from services.api.errors import Forbidden, Invalid, NotFound, Unauthorized
from shared.boards import Board
from shared.events import REGION_PATTERN, USER_ID_PATTERN
from shared.keys import Keys
from shared.periods import (
    PERIODS,
    Period,
    PeriodIdError,
    PeriodOutOfCalendar,
    PeriodRangeError,
    PeriodWindow,
    matches_id,
    previous_window,
    window_at,
    window_of,
)
from shared.ranking import score_of, sub_of

ScopeKind = Literal["users", "teams", "friends"]

SCOPE_PATTERN = (
    r"^(global|teams|region:[a-z0-9][a-z0-9_-]{0,31}|friends:[A-Za-z0-9][A-Za-z0-9_.:-]{0,63})$"
)
# Daily, weekly, monthly, all-time and season ids.
# Digits are ASCII ones: ``\d`` would take any script's.
PERIOD_ID_PATTERN = (
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{4}-W[0-9]{2}|[0-9]{4}-[0-9]{2}|all"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2})$"
)

_REGION = re.compile(REGION_PATTERN)
_USER_ID = re.compile(USER_ID_PATTERN)

# A sorted-set entry: its member (tie key, then id; shared/ranking.py) and its signed score.
Row = tuple[str, float]


@dataclass(frozen=True, slots=True)
class View:
    """One ranking of one board: a scope in one period.

    ``key`` is the sorted set read: the scope's own, or for ``friends`` the global view, of
    which only the owner and its friends are ranked.
    """

    board: Board
    scope: str
    period: Period
    period_id: str
    key: str
    kind: ScopeKind = "users"
    owner: str | None = None
    # When the period's window ends (UTC, exclusive); None for alltime.
    ends_at: datetime | None = None
    # A friends scope read with its owner's own player token: a hidden owner still sees itself.
    owner_reads: bool = False

    def score(self, stored: float) -> int:
        """The score of a sorted-set score (shared/ranking.py)."""
        return score_of(stored, self.board.descending)

    def signed(self, stored: float) -> int:
        """The signed score of a sorted-set score: the score, negated on ascending boards."""
        return int(stored)

    def rank_key(self, row: Row) -> tuple[int, str]:
        """What a row shares with those it ties with: signed score and subscore part."""
        return int(row[1]), sub_of(row[0])

    @property
    def ties(self) -> str:
        """The view's hash of records (tie key, score, metadata)."""
        return Keys.ties(self.key)


# The current window of each kind of period in each timezone (and schedule), kept while it is
# current: windows follow one another without gap or overlap, so the one that holds ``now`` is
# the one window_at would find. Reads name the current period far more often than one period
# ends, and finding it is a walk of a schedule's firings for a season (over a millisecond of
# CPU), a few µs of date arithmetic for a day. The oldest entry leaves first.
_CURRENT: dict[tuple[Period, str, str | None], PeriodWindow] = {}
_CURRENT_KEPT = 1024


def current_window(
    period: Period, now: datetime, timezone: str, schedule: str | None
) -> PeriodWindow:
    """``window_at(period, now, timezone, schedule)``, from the window kept if it holds
    ``now``."""
    key = (period, timezone, schedule)
    window = _CURRENT.get(key)
    if window is None or now < window.start or (window.end is not None and now >= window.end):
        window = window_at(period, now, timezone, schedule)
        if key not in _CURRENT and len(_CURRENT) >= _CURRENT_KEPT:
            del _CURRENT[next(iter(_CURRENT))]
        _CURRENT[key] = window
    return window


def resolve_window(
    board: Board, period: Period, period_id: str | None, *, ahead: float
) -> PeriodWindow:
    """The period a read names: 404 for one the board does not keep (not a board period, past
    retention, not yet begun), 422 for an id that names no period. One that begins within
    ``ahead`` seconds (the future tolerance of ``occurred_at``) is readable already: a write
    may have put a score in it, and answered with its id."""
    if period not in board.periods:
        raise NotFound(f"Board {board.board_id!r} does not keep a {period} period.")
    now = datetime.now(UTC)
    current = current_window(period, now, board.timezone, board.schedule)
    if period_id is None or period_id == current.period_id:
        return current
    not_kept = f"Period {period_id!r} is not kept (retention or not yet begun)."
    try:
        window = window_of(period, period_id, board.timezone, board.schedule)
    except PeriodOutOfCalendar as exc:  # at an end of the calendar: past retention, or to come
        raise NotFound(not_kept) from exc
    except PeriodIdError as exc:
        raise Invalid(str(exc), loc=("query", "period_id")) from exc
    oldest = _oldest_kept(current, board.timezone, board.retention.of(period) or 0, board.schedule)
    begun = window.start <= current.start or window.start <= now + timedelta(seconds=ahead)
    if not begun or (oldest is not None and window.start < oldest):
        raise NotFound(not_kept)
    return window


@functools.lru_cache(maxsize=1024)
def _oldest_kept(
    current: PeriodWindow, timezone: str, retention: int, schedule: str | None
) -> datetime | None:
    """The start of the oldest period a read may name while ``current`` runs (``None``: one
    before the calendar's start, so every earlier id is kept). The same for every read of the
    period: a retention of 10,000 minute seasons is a walk of 10,000 firings."""
    try:
        return previous_window(current, timezone, retention, schedule).start
    except PeriodRangeError:
        return None


def period_of_id(board: Board, period_id: str) -> Period:
    """Which kind of period an id names (the four formats differ); 404 if the board does not
    keep that kind, 422 if it names none."""
    for period in PERIODS:
        if period == "season" and board.schedule is None and matches_id(period, period_id):
            raise NotFound(f"Board {board.board_id!r} does not keep a season period.")
        try:
            window_of(period, period_id, board.timezone, board.schedule)
        except PeriodOutOfCalendar:
            pass  # a period of this kind all the same (resolve_window: not kept)
        except PeriodIdError:
            continue
        if period not in board.periods:
            raise NotFound(f"Board {board.board_id!r} does not keep a {period} period.")
        return period
    raise Invalid(f"{period_id!r} is not a period id.", loc=("query", "period_id"))


def check_friends_reader(reader: Principal, owner: str) -> None:
    """A friends scope is private: the player itself or a server or admin key."""
    if reader.kind == "anonymous":
        raise Unauthorized("A friends scope is read by its player or with a server key.")
    if not reader.may_act_for(owner):
        raise Forbidden("A player may read only its own friends scope.")


def undeclared_region(board: Board, scope: str) -> str | None:
    """The region a ``region:`` scope names where the board declares its regions and not that
    one; else None. Such a view is read only where it is kept (a region the declaration left
    out stays readable until its periods expire): else it is a typo, which an empty board would
    hide, and a 422 (as a write naming it is, and a socket's topic)."""
    region = scope.removeprefix("region:")
    if region == scope or board.regions is None or region in board.regions:
        return None
    return region


def refuse_undeclared(board: Board, region: str) -> Invalid:
    return Invalid(
        f"Board {board.board_id!r} declares no region {region!r} and keeps no view of it in "
        f"this period; its regions are {', '.join(board.regions or ())}.",
        loc=("query", "scope"),
    )


def resolve_view(
    keys: Keys,
    board: Board,
    scope: str,
    period: Period,
    period_id: str | None,
    *,
    ahead: float,
    reader: Principal | None = None,
) -> View:
    """The view a read names: 422 for a scope that is nonsense or not on this board, 401/403
    for a friends scope the reader may not see (without a ``reader``, friends scopes are not
    offered), 404 for a period the board does not keep."""
    kind: ScopeKind = "users"
    owner: str | None = None
    if scope == "global" or (
        scope.startswith("region:") and _REGION.fullmatch(scope.removeprefix("region:"))
    ):
        pass
    elif scope == "teams":
        if board.operator != "incr":
            raise Invalid(
                f"The teams scope sums members' scores and exists only on incr boards; board "
                f"{board.board_id!r} is {board.operator}.",
                loc=("query", "scope"),
            )
        kind = "teams"
    elif scope.startswith("friends:") and _USER_ID.fullmatch(scope.removeprefix("friends:")):
        if reader is None:
            raise Invalid(
                "The friends scope is not available on this read.", loc=("query", "scope")
            )
        kind, owner = "friends", scope.removeprefix("friends:")
        check_friends_reader(reader, owner)
    else:
        raise Invalid(
            "scope must be 'global', 'region:<region>', 'teams' or 'friends:<user_id>'.",
            loc=("query", "scope"),
        )
    window = resolve_window(board, period, period_id, ahead=ahead)
    bid, pid = board.board_id, window.period_id
    if kind == "friends":
        key = keys.global_view(bid, period, pid)
    else:
        key = keys.board_view(bid, period, pid, scope)
    own = reader is not None and reader.kind == "player" and reader.user_id == owner
    return View(board, scope, period, pid, key, kind, owner, window.end, own)
