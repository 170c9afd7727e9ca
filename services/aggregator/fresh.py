"""The regional views that consumed events changed, for their top-10 pushes (docs/
architecture.md, the aggregator): a region's view is the write's own, current without the merge,
so its push need not wait behind a merge backlog. :class:`~services.aggregator.handlers.MarkDirty`
notes them; :meth:`FreshRegions.push` pushes them before each merge pass. The merge's own pushes
that did not go out are kept in one too (services/aggregator/pass_pushes.py), any view's."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from redis.asyncio import Redis

from services.aggregator.tops import push_tops
from shared.boards import Board
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.periods import Period
from shared.submit import current_window


def is_current(board: Board, period: Period, period_id: str, now: datetime) -> bool:
    """Whether ``period_id`` names the board's current period of its kind at ``now``. A topic
    (``leaderboard:{board}:{scope}:{period}``) pushes that period's top alone: the top of a
    period past (a late event's) or not yet begun (an event ahead of the clock) would follow,
    or come before, the current one's on the same channel, an older top after a newer one. A
    period's final top comes in its ``period_closed`` push (docs/api.md sections 8b and 9)."""
    return current_window(period, now, board.timezone, board.schedule).period_id == period_id


class FreshRegions:
    """The views whose top 10 is to be looked at, by board: the regional views that consumed
    events changed since their top 10 was last looked at (a region's view is the write's own,
    current without the merge, so its top-10 push need not wait behind a merge backlog), and any
    view noted by :meth:`add_view` (:meth:`push`)."""

    def __init__(self) -> None:
        self._views: dict[str, set[tuple[Period, str, str]]] = defaultdict(set)

    def note(self, events: list[ScoreAccepted]) -> None:
        for event in events:
            for period, result in event.periods.items():
                self.add(event.board_id, period, result.period_id, event.region)

    def add(self, board_id: str, period: Period, period_id: str, region: str) -> None:
        self.add_view(board_id, period, period_id, f"region:{region}")

    def add_view(self, board_id: str, period: Period, period_id: str, scope: str) -> None:
        self._views[board_id].add((period, period_id, scope))

    def keep_only(self, board_ids: set[str]) -> None:
        """Forget the views of every board but ``board_ids`` (those defined now): a deleted
        board's would stay for the life of the process."""
        self._views = defaultdict(set, {b: v for b, v in self._views.items() if b in board_ids})

    def take(self, board_id: str) -> set[tuple[Period, str, str]]:
        return self._views.pop(board_id, set())

    def __contains__(self, board_id: str) -> bool:
        return bool(self._views.get(board_id))

    async def push(self, redis: Redis, keys: Keys, board: Board) -> int:
        """The top-10 pushes of ``board``'s views noted since the last call, whatever the merge
        has yet to do, of its current periods only (:func:`is_current`; the others are dropped);
        returns how many views were looked at. If a push fails, the views are
        noted again for the next call, which pushes each whose last push did not go out (its
        fingerprint was not stored: services/aggregator/tops.py); so is a view that other
        aggregators' pushes kept reaching first."""
        views = self.take(board.board_id)
        by_period: dict[tuple[Period, str], list[str]] = defaultdict(list)
        now = datetime.now(UTC)
        for period, period_id, scope in views:
            if period in board.periods and is_current(board, period, period_id, now):
                by_period[(period, period_id)].append(scope)
        try:
            for (period, period_id), scopes in by_period.items():
                left = await push_tops(redis, keys, board, period, period_id, sorted(scopes))
                for scope in left:
                    self.add_view(board.board_id, period, period_id, scope)
        except Exception:
            self._views[board.board_id] |= views
            raise
        return len(views)
