"""The bracket rules of docs/api.md section 9 and the badge rule of section 3, as pure functions;
and what a batch's events wrote, for the scores its rank messages carry."""

from __future__ import annotations

from collections import defaultdict

from shared.brackets import Crossing, smallest_entered
from shared.events import PeriodResult, ScoreAccepted, outbox_position
from shared.periods import Period

# A user's entry in one regional view: board, region, period, period id, user.
Entry = tuple[str, str, Period, str, str]


def entered(result: PeriodResult, brackets: tuple[int, ...]) -> int | None:
    """The smallest bracket this update moved the user into, if any."""
    return smallest_entered(result.rank, result.previous_rank, brackets)


def crossings(user_id: str, result: PeriodResult, brackets: tuple[int, ...]) -> list[Crossing]:
    """Every message one update causes in one scope and period.

    ``pushed_out`` was read in the same atomic step as the write: for each bracket T entered,
    the user now at rank T + 1, who held rank T before. Different brackets push out different
    users, so each displaced user gets one message naming the bracket it left. ``pulled_in``
    likewise names, for each bracket T the user's fall left, the user now at rank T, who held
    rank T + 1 before and has entered the top T: it gets ``entered_top``. Different brackets
    pull in different users too (each the one now at its rank).
    """
    out: list[Crossing] = []
    top = entered(result, brackets)
    if top is not None:
        out.append(Crossing(user_id, "entered_top", top, result.rank, result.previous_rank))
    pulled: set[str] = set()
    for bracket, moved in sorted(result.pulled_in.items(), key=lambda kv: int(kv[0])):
        t = int(bracket)
        if t in brackets and moved != user_id and moved not in pulled:
            pulled.add(moved)  # one message a user, naming the smallest bracket
            out.append(Crossing(moved, "entered_top", t, t, t + 1))
    for bracket, displaced in sorted(result.pushed_out.items(), key=lambda kv: int(kv[0])):
        t = int(bracket)
        if t in brackets and displaced != user_id:
            out.append(Crossing(displaced, "overtaken", t, t + 1, t))
    return out


def reaches(value: int, threshold: int, descending: bool) -> bool:
    """Whether one event's value reaches a badge threshold (docs/api.md section 3).

    On a ``desc`` board, higher is better: ``value >= threshold``. On an ``asc`` board, lower is
    better (a lap time, strokes), so a threshold is a mark to get down to: ``value <= threshold``.
    The value compared is the event's own, whatever the operator: on an ``incr`` board a badge
    marks one big play, not a running total.
    """
    return value >= threshold if descending else value <= threshold


def earned(value: int, badges: dict[str, int], descending: bool) -> list[str]:
    """The badges (by name, sorted) whose threshold one event's value reaches.

    Whether the user holds one already is not decided here but by the award itself, atomically.
    """
    return sorted(
        name for name, threshold in badges.items() if reaches(value, threshold, descending)
    )


class Written:
    """What a batch's events wrote, entry by entry, in the order they were written: the score a
    user held when another event of the batch moved it across a bracket.

    A rank message tells its user the score it held at that moment. One read of the view after
    the batch gives the score the user holds now, which its own later write in the same batch
    has changed already (a user overtaken, then back on top: its ``overtaken`` would carry the
    score that put it back). So where the user wrote too, the batch says what it held: the
    score of its last write before, or else the score its first write after replaced.
    A board's events are ordered by their outbox entries (``outbox_id``, which orders them as
    they were applied, whichever relay published them); an event without one (published before
    it was added) by its place in the batch, as one relay's are.
    """

    def __init__(self, events: list[ScoreAccepted]) -> None:
        self._order: dict[tuple[str, str, str], tuple[int, ...]] = {}
        self._writes: dict[Entry, list[tuple[tuple[int, ...], PeriodResult]]] = defaultdict(list)
        for index, event in enumerate(events):
            order = outbox_position(event.outbox_id) if event.outbox_id else (index,)
            self._order[(event.board_id, event.user_id, event.event_id)] = order
            for period, result in event.periods.items():
                entry = (event.board_id, event.region, period, result.period_id, event.user_id)
                self._writes[entry].append((order, result))
        for writes in self._writes.values():
            writes.sort(key=lambda write: write[0])

    def held(self, event: ScoreAccepted, period: Period, user_id: str) -> int | None:
        """The score ``user_id`` held in ``event``'s regional view of ``period`` when ``event``
        was written, as far as the batch tells; ``None`` where it does not (the user wrote
        nothing there in the batch): its entry is then as the view holds it now."""
        at = self._order[(event.board_id, event.user_id, event.event_id)]
        entry = (event.board_id, event.region, period, event.periods[period].period_id, user_id)
        writes = self._writes.get(entry, [])
        before = [result for order, result in writes if order < at]
        if before:
            return before[-1].score
        after = [result for order, result in writes if order > at]
        if not after:
            return None
        first = after[0]
        # A write that changed nothing left the score it found; one that changed it names the
        # score before (absent from entries of a release before it: unknown here).
        return first.previous_score if first.improved else first.score
