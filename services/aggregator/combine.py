"""A user's global entry from its regional ones, as the merge makes it in Redis
(``ladder_merge_v6``, shared/lua/merge.lua): the reference the tests hold that function to.

- ``incr``: the sum of the regional scores, reached when the latest of them was, with the
  metadata of that latest; a sum past +-(2**53 - 1) is held at that end of the range (reached and
  carried as an exact sum is), so that the entry does not depend on when the merge ran;
- ``best``: the best regional entry (best score, then subscore, reached earliest);
- ``set``: the regional entry written last (a region whose score was set again to the same
  score, after another's was set, is the latest; its entry keeps its first reach time).
"""

from __future__ import annotations

from shared.ranking import MAX_SCORE, reached_of, tie_key

# A regional or global entry: its signed score (shared/ranking.py), tie key, metadata, and the
# Unix ms of its latest write where its record keeps one (``written_of``: set boards; None where
# that is its reach time).
Entry = tuple[int, str, str, int | None]


def combine(operator: str, entries: list[Entry]) -> Entry:
    """A user's global entry from its regional ones (at least one)."""
    if len(entries) == 1:
        return entries[0]
    if operator == "best":
        # The best score, then subscore, then the earliest reached: the greatest in rank order.
        return max(entries, key=lambda entry: entry[:2])
    reached = [reached_of(entry[1]) for entry in entries]
    if operator == "set":
        written = [r if e[3] is None else e[3] for e, r in zip(entries, reached, strict=True)]
        return entries[written.index(max(written))]
    latest = reached.index(max(reached))
    total = max(-MAX_SCORE, min(MAX_SCORE, sum(entry[0] for entry in entries)))
    return total, tie_key(reached[latest]), entries[latest][2], None


def out_of_range(operator: str, entries: list[Entry]) -> bool:
    """Whether the user's global sum is past the range (held at its end by :func:`combine`): the
    merge reports such users, and the aggregator logs them."""
    total = sum(entry[0] for entry in entries)
    return operator == "incr" and len(entries) > 1 and abs(total) > MAX_SCORE
