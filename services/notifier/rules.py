"""The bracket rules of docs/api.md section 9 and the badge rule of section 3, as pure functions."""

from __future__ import annotations

from shared.brackets import Crossing, smallest_entered
from shared.events import PeriodResult


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
