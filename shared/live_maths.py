"""The live views of play (docs/api.md section 8a): hot streaks and team MVPs.

Both are computed from state the aggregator keeps in Redis (see :mod:`shared.keys`), never from
message counts, so the aggregator that computes them and the API that reads them agree.

Hot streaks
    The users with the highest average value per event over the last 10 or 60 seconds of event
    time. The wall clock is taken as the event-time frontier: an event counts from its arrival
    until its ``occurred_at`` is W seconds behind the clock (one stamped up to 5 s ahead of the
    clock, as the API allows, counts at once). An event accepted more than
    :data:`HOT_LATENESS` after its ``occurred_at`` is left out (it still counts toward its
    periods). Ties: the higher average, then more events, then the smaller user id. Each
    window's users are kept ranked so in Redis as events enter and leave it (its ranking,
    shared/lua/hot.lua), so that a tick reads the top alone; the average ranked and shown is
    the sum over the count as a double.

MVPs
    The users with the largest share of their team's total in one period. A user's team in a
    period is the team named by its latest accepted event in that period; its ``user_score``
    is what it scored for that team in that period, and ``team_score`` is that team's total
    (the ``teams`` scope). A user who changes team therefore ranks with its new team from its
    next event on, counting only what it scored for the new team; what it scored for the old
    team stays in that team's total. Only teams with a positive total and members with a
    positive contribution take part, and of the teams only the :data:`MVP_TEAMS` with the
    largest totals, which bounds the read's cost however many teams there are. Ties: the
    larger share, then the larger ``user_score``, then the smaller user id.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, cast

import orjson
from redis.asyncio import Redis

from shared.boards import Board
from shared.events import ScoreAccepted
from shared.keys import DERIVED_FIELD, Keys
from shared.periods import Period
from shared.ranking import id_of, score_of

TOP = 10
HOT_WINDOWS = (10, 60)
HOT_SPAN_MS = max(HOT_WINDOWS) * 1000
HOT_LATENESS = timedelta(seconds=5)
# The digits of the count that starts a member of a hot window's ranking (shared/lua/hot.lua).
HOT_COUNT_DIGITS = 12
# Members read per team and round when looking for a team's leading current members.
_MEMBER_PAGE = 2 * TOP
_CHUNK = 500
MVP_TEAMS = 500
"""The teams that take part in an MVP read: those of the MVP_TEAMS largest positive totals of the
period (docs/security.md, "Invented regions and teams")."""


def on_time(event: ScoreAccepted) -> bool:
    """Whether an event may count toward the hot view: accepted within 5 s of occurring."""
    return event.accepted_at - event.occurred_at <= HOT_LATENESS


def hot_member(event: ScoreAccepted) -> str:
    """The event's member of the hot set: the same for every delivery of one event.
    ``|`` cannot occur in an event id or a user id."""
    return f"{event.event_id}|{event.user_id}|{event.value}"


def hot_message(
    board_id: str, window: int, as_of: str | None, entries: list[dict[str, Any]]
) -> dict[str, Any]:
    """A hot view as the aggregator stores and pushes it, and a new subscriber is sent it."""
    return {
        "type": "leaderboard",
        "view": "hot",
        "board_id": board_id,
        "scope": "hot",
        "window": window,
        "as_of": as_of,
        "entries": entries,
    }


def mvp_message(
    board_id: str, period: str, period_id: str, as_of: str | None, entries: list[dict[str, Any]]
) -> dict[str, Any]:
    """An MVP view as the aggregator stores and pushes it, and a new subscriber is sent it."""
    return {
        "type": "leaderboard",
        "view": "mvps",
        "board_id": board_id,
        "scope": "mvps",
        "period": period,
        "period_id": period_id,
        "as_of": as_of,
        "entries": entries,
    }


def hot_current(board_id: str, window: int, stored: Any, quiet: Any) -> dict[str, Any]:
    """The hot view to answer with, from the one the aggregator stored (its JSON, or None once
    it expired) and ``quiet`` (:meth:`shared.keys.Keys.live_quiet`, or None): a view without
    entries is so as of the later of the two times, since the aggregator stops recomputing the
    empty view of a board without hot events until one comes (RFC 3339 times in one format
    order as text)."""
    view = orjson.loads(stored) if stored is not None else hot_message(board_id, window, None, [])
    if not view.get("entries") and quiet is not None:
        view["as_of"] = max(view.get("as_of") or "", str(quiet))
    return view


def without_hidden(entries: list[dict[str, Any]], hidden: set[str]) -> list[dict[str, Any]]:
    """A stored view's entries (hot or MVP) but those of ``hidden`` users, ranked again from 1 in
    the order they keep: what the aggregator's next computation, which leaves hidden users out,
    lists, but for the users it takes in after the last (a top of 10 has 9 until then). Both
    views rank their entries one after another, without shared ranks, so closing up is
    numbering them again."""
    kept = [entry for entry in entries if entry["user_id"] not in hidden]
    return [{**entry, "rank": rank} for rank, entry in enumerate(kept, start=1)]


def hot_entries(top: list[str]) -> list[dict[str, Any]]:
    """The hot view's entries from the top of a window's ranking (shared/lua/hot.lua's
    ``hot_top``: member, score, ...; a member is its user's count as 12 digits, then ``|`` and
    the user; a score the user's average negated)."""
    return [
        {
            "rank": i // 2 + 1,
            "user_id": top[i][HOT_COUNT_DIGITS + 1 :],
            "score": 0.0 - float(top[i + 1]),
        }
        for i in range(0, len(top), 2)
    ]


async def mvp_view(
    redis: Redis, keys: Keys, board: Board, period: Period, period_id: str
) -> tuple[str | None, list[dict[str, Any]]]:
    """The MVP top 10 of one period of an ``incr`` board, from the teams board (totals) and the
    aggregator's member contributions, and its ``as_of``: when the aggregator last applied a
    batch of the board's events (None before its first), read before the totals, so that every
    event applied before it counts. A user hidden on the board is not listed; its contribution
    stays in its team's total (docs/api.md section 8b)."""
    bid = board.board_id
    async with redis.pipeline(transaction=False) as pipe:
        pipe.smembers(keys.hidden(bid))
        pipe.hget(keys.as_of(bid), DERIVED_FIELD)
        hidden, as_of = cast(tuple[set[str], str | None], await pipe.execute())
    return as_of, await _mvp_entries(redis, keys, board, period, period_id, hidden)


async def _mvp_entries(
    redis: Redis, keys: Keys, board: Board, period: Period, period_id: str, hidden: set[str]
) -> list[dict[str, Any]]:
    bid = board.board_id
    teams_key = keys.teams_view(bid, period, period_id)
    # The MVP_TEAMS teams of the largest positive totals, not every team: the read's cost is
    # bounded whatever number of teams the board has (a stored score is the total, negated on
    # ascending boards).
    rows: list[Any] = await (
        redis.zrevrangebyscore(teams_key, "+inf", "(0", start=0, num=MVP_TEAMS, withscores=True)
        if board.descending
        else redis.zrangebyscore(teams_key, "-inf", "(0", start=0, num=MVP_TEAMS, withscores=True)
    )
    totals = {id_of(m): score_of(c, board.descending) for m, c in rows}
    teams = sorted(team for team, total in totals.items() if total > 0)
    team_of_key = keys.member_team(bid, period, period_id)
    candidates: list[tuple[str, str, int]] = []  # (user, team, contribution)
    offsets = dict.fromkeys(teams, 0)
    kept_of = dict.fromkeys(teams, 0)
    cut: dict[str, float] = {}  # teams whose reading stopped with members left: the last read
    pending = teams
    # Each team's leading members whose current team it still is; a team is read further only
    # while members who moved on fill its page.
    while pending:
        still: list[str] = []
        for start in range(0, len(pending), _CHUNK):
            chunk = pending[start : start + _CHUNK]
            async with redis.pipeline(transaction=False) as pipe:
                for team in chunk:
                    first = offsets[team]
                    pipe.zrevrange(
                        keys.team_members(bid, period, period_id, team),
                        first,
                        first + _MEMBER_PAGE - 1,
                        withscores=True,
                    )
                pages: list[list[tuple[str, float]]] = await pipe.execute()
            current = await _current_teams(redis, team_of_key, (u for p in pages for u, _ in p))
            for team, page in zip(chunk, pages, strict=True):
                kept = [
                    (user, team, int(score))
                    for user, score in page
                    if score > 0 and current.get(user) == team and user not in hidden
                ]
                candidates += kept
                kept_of[team] += len(kept)
                offsets[team] += len(page)
                if len(page) == _MEMBER_PAGE and page[-1][1] > 0:
                    if kept_of[team] < TOP:
                        still.append(team)
                    else:
                        cut[team] = page[-1][1]
        pending = still
    if cut:
        members_of = {team: keys.team_members(bid, period, period_id, team) for team in cut}
        candidates = await _ties_at_the_cuts(
            redis, (members_of, team_of_key), cut, candidates, hidden
        )

    def share(c: tuple[str, str, int]) -> float:
        return c[2] / totals[c[1]]

    ranked = sorted(candidates, key=lambda c: (-share(c), -c[2], c[0]))[:TOP]
    return [
        {
            "rank": i + 1,
            "user_id": user,
            "team_id": team,
            "user_score": score,
            "team_score": totals[team],
            "share": score / totals[team],
        }
        for i, (user, team, score) in enumerate(ranked)
    ]


async def _current_teams(redis: Redis, team_of_key: str, named: Iterable[str]) -> dict[str, str]:
    """The current team in the period of each user ``named`` who has one."""
    users = sorted(set(named))
    if not users:
        return {}
    found: list[Any] = await redis.hmget(team_of_key, users)
    return {
        user: latest.split("|", 1)[1]
        for user, latest in zip(users, found, strict=True)
        if latest is not None
    }


async def _ties_at_the_cuts(
    redis: Redis,
    keys_of: tuple[dict[str, str], str],
    cut: dict[str, float],
    candidates: list[tuple[str, str, int]],
    hidden: set[str],
) -> list[tuple[str, str, int]]:
    """``candidates`` with the members tied at each ``cut`` team's cut taken in the view's
    order. ``keys_of``: each team's member contributions, and the period's users' teams;
    ``cut``: the teams whose reading stopped with members left, each with the contribution of
    the last member read. A team's members were read from the largest contribution down, and of
    equal contributions Redis gives the larger user id first: where the smallest contribution
    among a team's leading :data:`TOP` is also the last one read, members of it may be left
    unread, and those read are not the smaller user ids the view ranks first. The members of
    that contribution are then read again in the order of their ids, smallest first (the teams
    in one pipelined round a page), and as many of them kept as the team's top holds."""
    members_of, team_of_key = keys_of
    # Each cut team's candidates, gathered in one walk: a walk a team would cost the teams times
    # the candidates (500 teams of 20 read each: 5 million steps a read).
    of_team: dict[str, list[tuple[str, str, int]]] = {team: [] for team in cut}
    for c in candidates:
        if c[1] in of_team:
            of_team[c[1]].append(c)
    need: dict[str, tuple[int, int]] = {}  # team -> (its tied contribution, places left for it)
    for team, last in cut.items():
        mine = sorted(of_team[team], key=lambda c: (-c[2], c[0]))
        tie = mine[TOP - 1][2]
        if tie == last:  # else every member of that contribution was read
            need[team] = (tie, TOP - sum(1 for c in mine if c[2] > tie))
    candidates = [c for c in candidates if c[1] not in need or c[2] != need[c[1]][0]]
    offsets = dict.fromkeys(need, 0)
    pending = sorted(need)
    while pending:
        async with redis.pipeline(transaction=False) as pipe:
            for team in pending:
                tie = need[team][0]
                pipe.zrangebyscore(
                    members_of[team], tie, tie, start=offsets[team], num=_MEMBER_PAGE
                )
            pages: list[list[str]] = await pipe.execute()
        current = await _current_teams(redis, team_of_key, (u for page in pages for u in page))
        still = []
        for team, page in zip(pending, pages, strict=True):
            tie, left = need[team]
            kept = [u for u in page if current.get(u) == team and u not in hidden][:left]
            candidates += [(user, team, tie) for user in kept]
            need[team] = (tie, left - len(kept))
            offsets[team] += len(page)
            if len(page) == _MEMBER_PAGE and left > len(kept):
                still.append(team)
        pending = still
    return candidates
