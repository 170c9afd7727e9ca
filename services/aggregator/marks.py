"""A merge's marks (``shared.keys.dirty_member``: ``<period>|<period_id>|<region>|<user_id>``)
in calls of the merge function."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

from shared.keys import parse_dirty_member


def _user_of(mark: str) -> str:
    return parse_dirty_member(mark)[3]


def by_user(marks: list[str], size: int) -> Iterator[list[str]]:
    """``marks`` (of one period) in calls of about ``size`` marks, a user's marks in several
    regions kept in one call: the call reads each of its users' regions once, so a user split
    over two calls would be combined, written and counted twice."""
    ordered = sorted(marks, key=_user_of)
    start = 0
    while start < len(ordered):
        end = min(start + size, len(ordered))
        while end < len(ordered) and _user_of(ordered[end]) == _user_of(ordered[end - 1]):
            end += 1
        yield ordered[start:end]
        start = end


def in_runs(chunk: list[str]) -> list[str | int]:
    """A call's marks as the merge function takes them (``ladder_merge_v6``): how many users
    they name, how many runs, each run's region, each run's count of marks, then the marks, run
    by run, a run the marks of one region (by region, then user). The function cuts each mark's
    id at a place its run's region gives, in place of finding where the region ends in every
    mark, and tells a user's marks apart by id only where there are fewer users than marks."""
    runs: dict[str, list[str]] = {}
    users = set()
    for (region, user), mark in sorted((parse_dirty_member(m)[2:], m) for m in chunk):
        runs.setdefault(region, []).append(mark)
        users.add(user)
    counts = (len(marks) for marks in runs.values())
    return [len(users), len(runs), *runs, *counts, *chain(*runs.values())]
