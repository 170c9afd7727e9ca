"""A merge's marks (``shared.keys.dirty_member``: ``<period>|<period_id>|<region>|<user_id>``)
in calls of the merge function. Each mark is split once here: on a backlog, every mark of it
passes through."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from operator import itemgetter

from shared.keys import parse_dirty_member

# A mark split: (user, region, the mark as the set holds it).
Split = tuple[str, str, str]

_USER = itemgetter(0)


def _split(marks: list[str]) -> list[Split]:
    """``marks`` split, in order of user."""
    split = [(u, r, mark) for mark in marks for _, _, r, u in (parse_dirty_member(mark),)]
    split.sort(key=_USER)
    return split


def by_user(marks: list[str], size: int) -> Iterator[list[Split]]:
    """``marks`` (of one period) in calls of about ``size`` marks, a user's marks in several
    regions kept in one call: the call reads each of its users' regions once, so a user split
    over two calls would be combined, written and counted twice."""
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
    by run, a run the marks of one region (in order of user, as the call has them); and the
    regions. The function cuts each mark's id at a place its run's region gives, in place of
    finding where the region ends in every mark, and tells a user's marks apart by id only
    where there are fewer users than marks."""
    runs: dict[str, list[str]] = {}
    users, last = 0, None
    for user, region, mark in call:
        runs.setdefault(region, []).append(mark)
        if user != last:  # the call is in order of user
            users, last = users + 1, user
    regions = list(runs)
    counts = (len(marks) for marks in runs.values())
    return [users, len(runs), *regions, *counts, *chain(*runs.values())], regions
