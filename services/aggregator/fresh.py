"""The regional views that consumed events changed, for their top-10 pushes (docs/
architecture.md, the aggregator): a region's view is the write's own, current without the merge,
so its push need not wait behind a merge backlog. :class:`~services.aggregator.handlers.MarkDirty`
notes them; :meth:`services.aggregator.merge.Merger.push_fresh` takes them before each pass."""

from __future__ import annotations

from collections import defaultdict

from shared.events import ScoreAccepted
from shared.periods import Period


class FreshRegions:
    """The regional views that consumed events changed since their top 10 was last looked at,
    by board: a region's view is the write's own, current without the merge, so its top-10 push
    need not wait behind a merge backlog (``Merger.push_fresh``)."""

    def __init__(self) -> None:
        self._views: dict[str, set[tuple[Period, str, str]]] = defaultdict(set)

    def note(self, events: list[ScoreAccepted]) -> None:
        for event in events:
            for period, result in event.periods.items():
                self.add(event.board_id, period, result.period_id, event.region)

    def add(self, board_id: str, period: Period, period_id: str, region: str) -> None:
        self._views[board_id].add((period, period_id, region))

    def take(self, board_id: str) -> set[tuple[Period, str, str]]:
        return self._views.pop(board_id, set())
