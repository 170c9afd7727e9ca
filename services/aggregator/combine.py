"""A user's global entry from its regional ones, as the merge makes it in Redis
(``ladder_merge_v6``, shared/lua/merge.lua): the reference the tests hold that function to.

- ``incr``: the sum of the regional scores, reached when the latest of them was, with the
  metadata of that latest;
- ``best``: the best regional entry (best score, then subscore, reached earliest);
- ``set``: the latest regional entry.
"""

from __future__ import annotations

from shared.ranking import MAX_SCORE, reached_of, tie_key

# A regional or global entry: its signed score (shared/ranking.py), tie key and metadata.
Entry = tuple[int, str, str]


def combine(operator: str, entries: list[Entry]) -> Entry | None:
    """A user's global entry from its regional ones (at least one); ``None`` if out of range,
    where the merge leaves the user's global entry as it was (its last exact total, or none)."""
    if len(entries) == 1:
        return entries[0]
    if operator == "best":
        # The best score, then subscore, then the earliest reached: the greatest in rank order.
        return max(entries, key=lambda entry: entry[:2])
    reached = [reached_of(tie) for _, tie, _ in entries]
    latest = reached.index(max(reached))
    if operator == "set":
        return entries[latest]
    total = sum(signed for signed, _, _ in entries)
    if abs(total) > MAX_SCORE:
        return None
    return total, tie_key(reached[latest]), entries[latest][2]
