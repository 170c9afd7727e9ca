"""A merge's marks (``shared.keys.dirty_member``: ``<period>|<period_id>|<region>|<user_id>``)
in calls of the merge function."""

from __future__ import annotations

from collections.abc import Iterator

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
