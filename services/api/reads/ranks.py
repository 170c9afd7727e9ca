"""A player's profile screen in one read: its score and rank in every period and every scope it
belongs to (docs/api.md section 5, ``GET /v1/boards/{board_id}/users/{user_id}/ranks``).

Round trips: one learns the user's regions (on a board that declares its regions, those of them
it scored in; on another, at most ``MAX_REGIONS`` of them), team and friends; one reads every
score, rank and size at once (``ladder_place_v3`` with no neighbours for each view, which also
counts what ranks strictly better for the competition and dense styles, and an ``HMGET`` of the
whole friend group's records per period).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from services.api.errors import NotFound
from services.api.reads.friends import MAX_FRIENDS, queue_entries, rank_locally
from services.api.reads.styles import RankStyle, counted, walk_ranks, walked, want_dense
from shared.boards import MAX_REGIONS, Board
from shared.functions import PLACE_FUNCTION
from shared.keys import DERIVED_FIELD, Keys, regions_of
from shared.periods import Period, PeriodWindow
from shared.ranking import id_of, score_of, sub_of


@dataclass(frozen=True, slots=True)
class _Probe:
    """One member of one sorted set: the user in a region or global view, or its team."""

    period: Period
    scope: str
    key: str
    member: str
    period_id: str = ""


@dataclass(frozen=True, slots=True)
class _Found:
    probe: _Probe
    stored: float
    position: int
    total: int
    # The entry's sorted-set member: its subscore part decides ties on a board with one.
    member: str
    # What ranks strictly better in the read's style (None for ordinal).
    above: int | None


async def user_ranks(
    redis: Redis,
    keys: Keys,
    board: Board,
    user_id: str,
    windows: list[PeriodWindow],
    style: RankStyle,
    with_friends: bool,
    own: bool = False,
) -> dict[str, Any]:
    """``{"periods": {period: {"period_id", "scopes": {scope: {"rank", "score", "total"}}}},
    "as_of"}``
    where a scope is ``global``, ``region:<r>``, ``teams`` (with ``team_id``) or ``friends``
    (only ``with_friends``, and only if the user has friends). A scope appears only where the
    user (or its team) has a score in that period; 404 if the user never scored on the board,
    or is hidden on it and ``own`` (the user's own read, with its player token) is not set: a
    hidden user's own read ranks it where it would be (docs/api.md section 8b)."""
    regions, team, friends, as_of = await _memberships(
        redis, keys, board, user_id, with_friends, own
    )
    # A user with friends has its friends scope, even where every friend is hidden on the board:
    # it then ranks alone, as among friends with no score (docs/api.md section 8b: the view is
    # as if the hidden user were not there).
    group = None if friends is None else [*friends, user_id]
    probes = _probes(keys, board.board_id, user_id, windows, regions, team)
    found, group_scores = await _read(
        redis, keys, board.board_id, probes, windows, group, style, own
    )
    ranks = [f.position if f.above is None else 1 + f.above for f in found]

    periods: dict[str, dict[str, Any]] = {
        w.period: {"period_id": w.period_id, "scopes": {}} for w in windows
    }
    for f, rank in zip(found, ranks, strict=True):
        period = f.probe.period
        entry: dict[str, Any] = {
            "rank": rank,
            "score": score_of(f.stored, board.descending),
            "total": f.total,
        }
        if f.probe.scope == "teams":
            entry = {"team_id": f.probe.member, **entry}
        periods[period]["scopes"][f.probe.scope] = entry
    for w, flat in zip(windows, group_scores, strict=False):
        assert group is not None  # group scores are read only for a group
        among = _among_friends(board, user_id, group, flat, style)
        if among is not None:
            periods[w.period]["scopes"]["friends"] = among
    return {"periods": periods, "as_of": as_of}


async def _memberships(
    redis: Redis, keys: Keys, board: Board, user_id: str, with_friends: bool, own: bool
) -> tuple[list[str], str | None, list[str] | None, str | None]:
    """The user's regions, team (incr boards) and friends not hidden on the board (``None``
    without ``with_friends`` or for a user with no friends at all; a list, perhaps empty, for a
    user with friends), and when the aggregator, which keeps the regions and team, last applied
    a batch of the board (its as_of); 404 if it has no region, having never scored on the board
    (or not yet derived)."""
    bid = board.board_id
    declared = list(board.regions) if board.regions is not None else None
    async with redis.pipeline(transaction=False) as pipe:
        # The user's field of the users' regions hash, or, where it has none yet, its set of the
        # layout before, bounded however many it holds (docs/security.md, "Invented regions and
        # teams"): the declared regions it holds, or at most MAX_REGIONS of its members.
        pipe.hget(keys.user_regions(bid), user_id)
        legacy = keys.legacy_user_regions(bid, user_id)
        if declared is not None:
            pipe.smismember(legacy, declared)
        else:
            pipe.srandmember(legacy, MAX_REGIONS)
        pipe.hget(keys.user_team(bid), user_id)
        pipe.hget(keys.as_of(bid), DERIVED_FIELD)
        pipe.smembers(keys.hidden(bid))
        if with_friends:
            pipe.smembers(keys.friends(user_id))
        learned = await pipe.execute()
    field, legacy_read, team_of, as_of, hidden = learned[:5]
    if user_id in hidden and not own:
        raise NotFound(f"User {user_id!r} has no score on board {bid!r}.")
    # 404 for a user with no region at all; one whose regions the board no longer declares
    # (narrowed since) keeps its global and team standings, and no regional one.
    if not field and not any(legacy_read):
        raise NotFound(f"User {user_id!r} has no score on board {bid!r}.")
    regions = _regions(declared, field, legacy_read)
    team: str | None = team_of if board.operator == "incr" else None
    friends = None
    if with_friends and set(learned[5]) - {user_id}:
        friends = sorted(set(learned[5]) - {user_id} - hidden)[:MAX_FRIENDS]
    return regions, team, friends, as_of


def _regions(declared: list[str] | None, field: str | None, legacy: list[Any]) -> list[str]:
    """The user's regions, sorted: those of its field of the users' regions hash (the declared
    ones, or the first ``MAX_REGIONS``), or else of its set of the layout before (``legacy``:
    ``SMISMEMBER`` of the declared regions, or ``SRANDMEMBER`` of ``MAX_REGIONS``)."""
    if field is not None:
        held = regions_of(field)
        return (
            sorted(set(held) & set(declared))
            if declared is not None
            else sorted(held)[:MAX_REGIONS]
        )
    if declared is None:
        return sorted(legacy)
    return sorted(r for r, held in zip(declared, legacy, strict=True) if held)


def _probes(
    keys: Keys,
    bid: str,
    user_id: str,
    windows: list[PeriodWindow],
    regions: list[str],
    team: str | None,
) -> list[_Probe]:
    probes: list[_Probe] = []
    for w in windows:
        p, pid = w.period, w.period_id
        probes.append(_Probe(p, "global", keys.global_view(bid, p, pid), user_id, pid))
        probes += [
            _Probe(p, f"region:{r}", keys.region_view(bid, p, pid, r), user_id, pid)
            for r in regions
        ]
        if team:
            probes.append(_Probe(p, "teams", keys.teams_view(bid, p, pid), team, pid))
    return probes


async def _read(
    redis: Redis,
    keys: Keys,
    bid: str,
    probes: list[_Probe],
    windows: list[PeriodWindow],
    group: list[str] | None,
    style: RankStyle,
    own: bool = False,
) -> tuple[list[_Found], list[Any]]:
    """Every probe's score, position, size and style count, and (with a ``group``: the user and
    its friends) the whole group's scores in each period's global view: one round trip."""
    async with redis.pipeline(transaction=False) as pipe:
        for probe in probes:
            # Position, score, size and style count of the probe's entry (no neighbours): {} if
            # none.
            view_keys = (probe.key, Keys.ties(probe.key), keys.names(bid), keys.distinct(probe.key))
            # A user's own read places it even while hidden ('self'); a team is never hidden.
            own_read = "self" if own and probe.scope != "teams" else ""
            pipe.fcall_ro(PLACE_FUNCTION, 4, *view_keys, probe.member, 0, style, own_read)
        if group is not None:
            for w in windows:
                queue_entries(pipe, keys.global_view(bid, w.period, w.period_id), group)
        replies = await pipe.execute()
    # Dense counts of views without their distinct-score set (a global view not built yet).
    unbuilt = [p for p, r in zip(probes, replies, strict=False) if r and walked(r[6])]
    if unbuilt:
        await want_dense(redis, keys, bid, unbuilt)
    found = [
        _Found(
            probe,
            float(reply[1]),
            int(reply[0]) + 1,
            int(reply[2]),
            reply[3][0],
            None if style == "ordinal" else counted(reply[6]),
        )
        for probe, reply in zip(probes, replies, strict=False)
        if reply
    ]
    return found, replies[len(probes) :]


def _among_friends(
    board: Board,
    user_id: str,
    group: list[str],
    flat: list[Any],
    style: RankStyle,
) -> dict[str, Any] | None:
    """The user's place among its friends in one period; ``None`` if it has no score there."""
    rows = rank_locally(group, flat)
    at = next((i for i, (m, _) in enumerate(rows) if id_of(m) == user_id), None)
    if at is None:
        return None
    local = walk_ranks(style, [(int(c), sub_of(m)) for m, c in rows], 1, 1)
    return {
        "rank": local[at],
        "score": score_of(rows[at][1], board.descending),
        "total": len(rows),
    }
