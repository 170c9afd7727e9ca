"""A merge's marks (``shared.keys.dirty_member``: ``<period>|<period_id>|<region>|<user_id>``)
in calls of the merge function, and what a call names besides them (:func:`call_head`). Each
mark is split once here: on a backlog, every mark of it passes through."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import chain
from operator import itemgetter

from shared.boards import Board
from shared.keys import Keys, dirty_member, parse_dirty_member
from shared.periods import Period
from shared.submit import board_period_expiry

# A mark split: (user, region, the mark as the set holds it).
Split = tuple[str, str, str]
# The scope of the global view, as the dense marker names it (shared/keys.py ``dense``).
GLOBAL = "global"
# The start of a regional view's scope in the build set ("region:<region>").
REGION = "region:"
# A key (or mark) of a placeholder id, split there, gives the Lua its two ends: shared/keys.py
# stays the only place that spells them. NUL is in no id.
_SLOT = "\0"

_USER = itemgetter(0)


def _split(marks: list[str]) -> list[Split]:
    """``marks`` (of one period) split, in order of region and, within a region, of user: the
    marks' own order, the part before the region being the same in all. The marks of a user
    with marks in several regions (rare) go last, together, in order of user. A mark given twice
    (``SSCAN`` may return a member twice) is taken once: the function would read its region's
    record twice, and an ``incr`` user's global total would count it twice."""
    split = [
        (u, r, mark) for mark in sorted(set(marks)) for _, _, r, u in (parse_dirty_member(mark),)
    ]
    if len({user for user, _, _ in split}) == len(split):
        return split
    several = {user for user, n in Counter(s[0] for s in split).items() if n > 1}
    together = sorted((s for s in split if s[0] in several), key=_USER)
    return [s for s in split if s[0] not in several] + together


def by_user(marks: list[str], size: int) -> Iterator[list[Split]]:
    """``marks`` (of one period) in calls of about ``size`` marks, a user's marks in several
    regions kept in one call: the call reads each of its users' regions once, so a user split
    over two calls would be combined, written and counted twice. The calls take the marks
    region by region: the function reads a region's records with one ``HMGET`` a run of its
    marks, and calls of marks in order of user alone made runs of one or two marks on a board
    of many regions (a round of 5,000 marks over 300 regions, 60 a call)."""
    ordered = _split(marks)
    start = 0
    while start < len(ordered):
        end = min(start + size, len(ordered))
        while end < len(ordered) and ordered[end][0] == ordered[end - 1][0]:
            end += 1
        yield ordered[start:end]
        start = end


def in_runs(call: list[Split]) -> tuple[list[str | int], list[str]]:
    """A call's marks as the merge function takes them (``ladder_merge_v6``): how many users
    they name, how many runs, each run's region, each run's count of marks, then the marks, run
    by run, a run the marks of one region (in the call's order); and the regions. The function
    cuts each mark's id at a place its run's region gives, in place of finding where the region
    ends in every mark, and tells a user's marks apart by id only where there are fewer users
    than marks."""
    runs: dict[str, list[str]] = {}
    users, last = 0, None
    for user, region, mark in call:
        runs.setdefault(region, []).append(mark)
        if user != last:  # a user's marks are next to each other in a call
            users, last = users + 1, user
    regions = list(runs)
    counts = (len(marks) for marks in runs.values())
    return [users, len(runs), *regions, *counts, *chain(*runs.values())], regions


def _ends(template: str) -> tuple[str, str]:
    """The two ends of a key or mark built around ``_SLOT``."""
    prefix, suffix = template.split(_SLOT)
    return prefix, suffix


def call_head(
    keys: Keys, board: Board, period: Period, period_id: str, marks_set: str, token: str
) -> tuple[list[str], list[str | int]]:
    """The keys of a merge call of one period of ``board`` (its marks taken out of
    ``marks_set``), and the arguments before its marks, under the lease held with ``token``
    (shared/lua/merge.lua says what each is)."""
    bid = board.board_id
    global_key = keys.global_view(bid, period, period_id)
    view_keys = [
        global_key,
        keys.distinct(global_key),
        keys.ties(global_key),
        marks_set,
        keys.distinct_building(global_key),
        keys.dense(bid),
        keys.hidden(bid),
        keys.merge_lease(bid),
        keys.user_regions(bid),
    ]
    head: list[str | int] = [
        board_period_expiry(board, period, period_id) or 0,
        board.operator,
        *_ends(keys.ties(keys.region_view(bid, period, period_id, _SLOT))),
        *_ends(keys.legacy_user_regions(bid, _SLOT)),
        *_ends(dirty_member(period, period_id, _SLOT, "")),
        GLOBAL,
        token,
    ]
    return view_keys, head


def buildable(board: Board, item: str) -> bool:
    """Whether a member of the board's dense build set ("<period>|<period_id>|<scope>") names a
    view whose distinct-score set the aggregator builds: a global or regional view of a period
    the board keeps (a team view keeps its set always: the derive step's put_entry)."""
    period, _, scope = item.split("|", 2)
    return period in board.periods and (scope == GLOBAL or scope.startswith(REGION))
