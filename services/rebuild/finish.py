"""The end of a board's rebuild: staging put in place of the live keys in one atomic step, then
every user of the board's views marked for the aggregator's next merge."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis

from services.rebuild.flag import BoardFlag
from services.rebuild.keyspace import region_sets, region_views
from services.rebuild.staging import Staged
from shared.functions import REBUILD_FINISH_FUNCTION
from shared.keys import Keys, dirty_member, parse_view
from shared.submit import finish_keys


async def finish(
    redis: Redis,
    keys: Keys,
    flag: BoardFlag,
    staged: Staged,
    journal: Staged,
    live: set[str],
    known: Iterable[str],
) -> tuple[str, str, int]:
    """``ladder_rebuild_finish_v10``: replay the journaled events MySQL did not hold (those not in
    ``known``) onto staging, check the event counters, rename staging over the live keys (and
    delete the ``live`` keys the rebuild did not make again), clear the journaled events'
    derive-pending bits (staging holds their derived views), drop flag and journal. The
    regional views' distinct-score sets, and the sets being built, are among the live keys
    with no staging copy: the step deletes them (the rebuilder asks the aggregator to build
    again those the board had).

    It is given every key the rebuild knows of, with its staging name: those ``staged`` from
    MySQL, those of the journal's events as read (``journal``) and ``live``. Writes go on
    meanwhile: an event journaled after the journal was read may name a key not given (and has
    a record not given), and the step names their staging copies itself, under the board's hash
    tag (shared/lua/rebuild.lua), so that one call finishes at any write rate. (Such an event is
    not among ``known``: MySQL's snapshot was taken before.)

    Returns the status ("ok" or why not), its detail (on "ok", how many journaled events were
    replayed) and how many keys the rebuild made or replaced."""
    counters = sorted(staged.counters | journal.counters)
    named = staged.others | journal.others | live
    # Every regional view's distinct-score set and the one being built go (the replay makes
    # none): one the aggregator made meanwhile would not follow the staged view.
    named |= region_sets(region_views(keys, flag.board_id, named))
    others = sorted(named - set(counters))
    records = sorted(journal.records)
    call_keys = finish_keys(keys, flag.board_id, counters, others, records)
    status, detail = await redis.fcall(
        REBUILD_FINISH_FUNCTION,
        len(call_keys),
        *call_keys,
        len(counters),
        flag.token,
        len(records),
        *sorted(known),
    )
    return status, detail, len(staged.counters | staged.others | live)


async def mark_dirty(redis: Redis, keys: Keys, board_id: str, views: set[str]) -> int:
    """Every user of the given regional and global views marked for the next merge: the
    aggregator then writes each global entry from the rebuilt regions. The users are those with
    a record in a view's hash, hidden users (a record, no member) among them: the merge keeps
    their global records too (kept hidden).

    A global view in the layout before exact scores (composite scores, bare user ids for
    members, no hash of tie keys beside it) is deleted once its users are marked: the merge
    makes it again, in the layout of shared/ranking.py."""
    tag = keys.tag(board_id)
    dirty = keys.dirty(board_id)
    marked = 0
    for key in sorted(views):
        parsed = parse_view(key[len(tag) + 1 :])
        if parsed is None:
            continue
        period, period_id, named = parsed
        if named is not None:
            region = named
        else:
            found: set[Any] = await redis.smembers(keys.regions(board_id, period, period_id))
            region = min(found) if found else ""
        # A view of an earlier layout: packed scores with bare ids for members (no hash), or
        # a hash of bare tie keys rather than records.
        sample: Any = await redis.hrandfield(keys.ties(key), 1, withvalues=True)
        packed = not sample
        old_layout = packed or "|" not in sample[1]
        # Each user from the view's hash of records, which holds a hidden user too (a record
        # with no member, docs/architecture.md "Hidden users"); the members only where the view
        # has no hash (packed scores with bare ids).
        users: Any = (
            (member async for member, _ in redis.zscan_iter(key, count=1000))
            if packed
            else (user async for user, _ in redis.hscan_iter(keys.ties(key), count=1000))
        )
        members: list[str] = []
        async for user in users:
            members.append(dirty_member(period, period_id, region, user))
            if len(members) >= 1000:
                marked += await redis.sadd(dirty, *members)
                members = []
        if members:
            marked += await redis.sadd(dirty, *members)
        if old_layout:
            await redis.unlink(key, keys.distinct(key), keys.ties(key))
    return marked
