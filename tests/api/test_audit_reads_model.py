"""Random sequences of scores through the real API, every read held against a plain model of
docs/api.md sections 3 to 5.

Each seed makes a board (an operator, an order, a subscore order or none, values across
±(2**53 - 1)), posts a random sequence of events one by one and in batches (several users,
regions and teams, equal scores, events of the same millisecond, late events in any order,
metadata, retries of accepted events and reused ids with another body) and checks each answer:
the region's score, rank, previous rank and whether it improved. Then every region's board is
read page by page (random limits, every rank style), every user's standing with its neighbours;
once the aggregator's steps have run, the global board, the teams scope, a friends scope and
every user's ranks call the same way. The model is the contract's words: a score is reached when
section 3 says, equal scores rank the one reached first higher, and of two reached in the same
millisecond the greater id.

``LADDER_AUDIT_SEEDS`` (comma-separated) runs other seeds than the few kept here.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from services.aggregator.handlers import MarkDirty
from services.aggregator.merge import Merger
from shared.boards import Board
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from tests.api.helpers import add_board, assert_problem, rfc
from tests.helpers import SERVER, api_client, derive

SEEDS = [int(s) for s in os.environ.get("LADDER_AUDIT_SEEDS", "3,7,11,19,23").split(",")]
USERS = ["a", "b", "c", "Z-9", "u.1:x"]
REGIONS = ["eu", "na", "ap"]
TEAMS = ["red", "blue", None]
EDGES = [MAX_SCORE, -MAX_SCORE, MAX_SCORE - 1, 2**52, -(2**52), 0]
STYLES = ("ordinal", "competition", "dense")
FRIENDS = {"a": ["b", "Z-9"]}


@dataclass
class Entry:
    score: int
    sub: int | None
    reached: int  # Unix ms
    last: int  # Unix ms of the latest write that counted
    meta: dict[str, Any] | None = None


Row = tuple[str, int, int | None, dict[str, Any] | None]  # id, score, subscore, metadata


@dataclass
class Model:
    operator: str
    order: str
    sub_order: str | None
    regions: dict[str, dict[str, Entry]] = field(default_factory=dict)
    teams: dict[str, Entry] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # the latest sent by an accepted event

    def signed(self, score: int, sub: int | None) -> tuple[int, int]:
        """Smaller is better."""
        first = -score if self.order == "desc" else score
        second = 0 if sub is None else (-sub if self.sub_order == "desc" else sub)
        return first, second

    def key(self, name: str, e: Entry) -> tuple[Any, ...]:
        # Of two reached in the same millisecond, the greater id first.
        return (*self.signed(e.score, e.sub), e.reached, tuple(-b for b in name.encode()), 1)

    def apply(
        self, region: str, user: str, value: int, sub: int | None, at: int, meta: Any
    ) -> bool | None:
        """Whether the stored score changed; None: refused (out of range), nothing written."""
        board = self.regions.setdefault(region, {})
        old = board.get(user)
        if old is None:
            board[user] = Entry(value, sub, at, at, meta)
            return True
        if self.operator == "incr":
            total = old.score + value
            if abs(total) > MAX_SCORE:
                return None
            if at >= old.reached:
                old.meta = meta
            old.score, old.reached = total, max(old.reached, at)
            return value != 0
        new, held = self.signed(value, sub), self.signed(old.score, old.sub)
        if self.operator == "best":
            if new < held:
                old.score, old.sub, old.reached, old.meta = value, sub, at, meta
                return True
            if new == held and at < old.reached:
                old.reached, old.meta = at, meta
            return False
        if at < old.last:  # set: a late event changes nothing
            return False
        old.last, old.meta = at, meta
        if new == held:
            return False
        old.score, old.sub, old.reached = value, sub, at
        return True

    def add_team(self, team: str, value: int, at: int) -> None:
        old = self.teams.get(team)
        if old is None:
            self.teams[team] = Entry(value, None, at, at)
        elif abs(old.score + value) <= MAX_SCORE:  # past the range: left out of the total
            old.score, old.reached = old.score + value, max(old.reached, at)

    def ranked(self, board: dict[str, Entry]) -> list[Row]:
        names = sorted(board, key=lambda u: self.key(u, board[u]))
        return [(u, board[u].score, board[u].sub, board[u].meta) for u in names]

    def merged(self) -> dict[str, Entry]:
        out: dict[str, Entry] = {}
        # Of two regions written in the same millisecond, the first in byte order is the latest.
        for _, board in sorted(self.regions.items(), key=lambda item: item[0].encode()):
            for user, e in board.items():
                old = out.get(user)
                if old is None:
                    out[user] = Entry(e.score, e.sub, e.reached, e.last, e.meta)
                elif self.operator == "incr":  # clamped once summed, below
                    latest = e if e.reached > old.reached else old
                    out[user] = Entry(old.score + e.score, None, latest.reached, 0, latest.meta)
                elif self.operator == "best":
                    if self.key(user, e) < self.key(user, old):
                        out[user] = Entry(e.score, e.sub, e.reached, e.last, e.meta)
                elif e.last > old.last:
                    out[user] = Entry(e.score, e.sub, e.reached, e.last, e.meta)
        for entry in out.values():
            entry.score = max(-MAX_SCORE, min(MAX_SCORE, entry.score))
        return out


def styled(rows: list[Row], style: str) -> list[int]:
    ranks: list[int] = []
    dense = 0
    for i, row in enumerate(rows):
        if style == "ordinal" or i == 0 or row[1:3] != rows[i - 1][1:3]:
            dense += 1
            ranks.append(i + 1 if style != "dense" else dense)
        else:
            ranks.append(ranks[-1])
    return ranks


def draw(rng: random.Random, operator: str) -> int:
    pick = rng.random()
    if pick < 0.55:
        return rng.randint(-2, 3)
    if pick < 0.8:
        return rng.choice(EDGES) * (1 if operator != "incr" else rng.choice([1, -1]))
    return rng.randint(-MAX_SCORE, MAX_SCORE)


def as_row(entry: dict[str, Any], name: str = "user_id") -> Row:
    return (entry[name], entry["score"], entry.get("subscore"), entry["metadata"])


async def aggregate(redis: Redis, keys: Keys, board: Board) -> None:
    """What the aggregator does with the outbox: derive its views, mark dirty, merge once."""
    rows: list[Any] = await redis.xrange(keys.outbox(board.board_id))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in rows]
    await derive(redis, keys, board, events, 100)
    await MarkDirty(redis, keys)(events)
    assert await Merger(redis, keys).merge_board(board) > 0


async def read_pages(
    client: httpx.AsyncClient, path: str, rng: random.Random, params: dict[str, Any]
) -> tuple[list[dict[str, Any]], int]:
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(50):
        query = {**params, "limit": rng.choice([1, 2, 3, 1000])}
        if cursor is not None:
            query["cursor"] = cursor
        response = await client.get(path, params=query, headers=SERVER)
        assert response.status_code == 200, response.text
        page = response.json()
        entries += page["entries"]
        cursor = page["next_cursor"]
        if cursor is None:
            return entries, page["total"]
    raise AssertionError("the pages never ended")


async def check_scope(
    client: httpx.AsyncClient,
    board_id: str,
    rng: random.Random,
    scope: str,
    expected: list[Row],
    names: dict[str, str] | None = None,
) -> None:
    """Every style's pages, then every member's standing, against ``expected`` (and the users'
    display names against ``names`` where given)."""
    path = f"/v1/boards/{board_id}/leaderboard"
    name = "team_id" if scope == "teams" else "user_id"
    for style in STYLES:
        entries, total = await read_pages(client, path, rng, {"scope": scope, "rank_style": style})
        assert total == len(expected), scope
        assert [as_row(e, name) for e in entries] == expected, (scope, style)
        if names is not None:
            assert [e["display_name"] for e in entries] == [names.get(r[0]) for r in expected]
        assert [e["rank"] for e in entries] == styled(expected, style), (scope, style)
    if scope == "teams":
        return
    for position, row in enumerate(expected):
        around, style = rng.choice([0, 1, 2, 50]), rng.choice(STYLES)
        response = await client.get(
            f"/v1/boards/{board_id}/users/{row[0]}",
            params={"scope": scope, "around": around, "rank_style": style},
            headers=SERVER,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        ranks = styled(expected, style)
        assert (body["rank"], body["total"]) == (ranks[position], len(expected)), scope
        assert as_row(body) == row, scope
        share = round(100.0 * (len(expected) - position) / len(expected), 2)
        assert body["percentile"] == share, scope
        start = max(position - around, 0)
        near = expected[start : position + around + 1]
        assert [as_row(e) for e in body["around"]] == near, scope
        assert [e["rank"] for e in body["around"]] == ranks[start : start + len(near)], scope
    missing = next((u for u in USERS if u not in {row[0] for row in expected}), None)
    if missing is not None and not scope.startswith("friends"):
        response = await client.get(
            f"/v1/boards/{board_id}/users/{missing}", params={"scope": scope}
        )
        assert_problem(response, 404)


def event(rng: random.Random, model: Model, n: int, moments: list[int]) -> dict[str, Any]:
    at = rng.choice(moments)
    body: dict[str, Any] = {
        "event_id": f"e{n}",
        "user_id": rng.choice(USERS),
        "region": rng.choice(REGIONS),
        "value": draw(rng, model.operator),
        "occurred_at": rfc(datetime.fromtimestamp(at / 1000, UTC)),
    }
    if model.sub_order is not None:
        body["subscore"] = rng.choice([0, 1, -1, MAX_SCORE, -MAX_SCORE])
    if rng.random() < 0.5:
        body["metadata"] = {"n": n}
    if rng.random() < 0.3:
        body["display_name"] = rng.choice(["Ana", "Bo \u00e9", "\U0001f600"])
    team = rng.choice(TEAMS)
    if team is not None:
        body["team_id"] = team
    return body


BRACKETS = [1, 2, 3]


def expect(
    model: Model, body: dict[str, Any], at: int, sent: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """The alltime part of the answer the model gives ``body`` (None: a 422), applied; what the
    event published for it must carry besides goes to ``sent``."""
    region, user = body["region"], body["user_id"]
    rows = model.ranked(model.regions.get(region, {}))
    before = [row[0] for row in rows]
    previous = before.index(user) + 1 if user in before else None
    changed = model.apply(
        region, user, body["value"], body.get("subscore"), at, body.get("metadata")
    )
    if changed is None:
        return None
    if "display_name" in body:
        model.names[user] = body["display_name"]
    if "team_id" in body and model.operator == "incr":
        model.add_team(body["team_id"], body["value"], at)
    after = model.ranked(model.regions[region])
    names = [row[0] for row in after]
    rank = names.index(user) + 1
    published: dict[str, Any] = {}
    for top in BRACKETS:
        # Into a top: whoever held its last place is out; out of one: whoever took it is in.
        if rank <= top < (previous or top + 1) and len(before) >= top:
            published.setdefault("pushed_out", {})[str(top)] = before[top - 1]
        if (previous or top + 1) <= top < rank:
            published.setdefault("pulled_in", {})[str(top)] = names[top - 1]
    if changed and previous is not None:
        published["previous_score"] = rows[previous - 1][1]
        if model.sub_order is not None:
            published["previous_subscore"] = rows[previous - 1][2]
    sent[body["event_id"]] = published
    return {"score": after[rank - 1][1], "rank": rank, "previous_rank": previous,
            "improved": changed}  # fmt: skip


async def check_published(
    redis: Redis,
    keys: Keys,
    board_id: str,
    published: dict[str, dict[str, Any]],
    team_of: dict[str, str],
) -> None:
    """Each accepted event's alltime brackets and previous score, as its outbox entry has them;
    ``team_of`` takes each user's team."""
    rows: list[Any] = await redis.xrange(keys.outbox(board_id))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in rows]
    assert sorted(e.event_id for e in events) == sorted(published)
    # A user's team: that of its latest event (by accepted_at, to the millisecond) that named
    # one; of two accepted in the same millisecond, the team greater byte by byte.
    latest: dict[str, tuple[int, bytes]] = {}
    for e in events:
        if e.team_id is not None:
            stamp = (int(e.accepted_at.timestamp() * 1000), e.team_id.encode())
            latest[e.user_id] = max(latest.get(e.user_id, stamp), stamp)
    team_of.update({user: team.decode() for user, (_, team) in latest.items()})
    for accepted in events:
        alltime = accepted.periods["alltime"]
        got = {
            name: getattr(alltime, name)
            for name in ("pushed_out", "pulled_in", "previous_score", "previous_subscore")
            if getattr(alltime, name)
        }
        want = {k: v for k, v in published[accepted.event_id].items() if v}
        assert got == want, accepted


async def write(
    client: httpx.AsyncClient,
    model: Model,
    rng: random.Random,
    board_id: str,
    published: dict[str, dict[str, Any]],
) -> None:
    """The random sequence of events, one by one and in batches, each answer checked."""
    base = int((datetime.now(UTC) - timedelta(seconds=400)).timestamp() * 1000)
    moments = sorted(base + rng.randint(0, 300_000) for _ in range(12))
    sent: list[tuple[dict[str, Any], dict[str, Any]]] = []
    n = 0
    while n < 50:
        batch = rng.random() < 0.3
        bodies: list[dict[str, Any]] = []
        wants: list[Any] = []
        for _ in range(rng.randint(1, 6) if batch else 1):
            n += 1
            accepted = [i for i, w in enumerate(wants) if isinstance(w, dict) and "rank" in w]
            if accepted and rng.random() < 0.2:  # an event twice in one batch
                i = rng.choice(accepted)
                again = rng.random() < 0.7
                bodies.append(
                    bodies[i] if again else {**bodies[i], "value": bodies[i]["value"] ^ 1}
                )
                wants.append(("again", i) if again else "conflict")
            elif sent and rng.random() < 0.1:  # a retry: the first answer, marked a duplicate
                body, first = rng.choice(sent)
                bodies.append(body)
                wants.append({**first, "duplicate": True})
            elif sent and rng.random() < 0.05:  # the same id and user, another body: 409
                body, _ = rng.choice(sent)
                bodies.append({**body, "value": 1 if body["value"] != 1 else 2})
                wants.append("conflict")
            else:
                body = event(rng, model, n, moments)
                at = int(datetime.fromisoformat(body["occurred_at"]).timestamp() * 1000)
                bodies.append(body)
                alltime = expect(model, body, at, published)
                wants.append("range" if alltime is None else alltime)
        path = f"/v1/boards/{board_id}/scores"
        if batch:
            response = await client.post(path + "/batch", json={"events": bodies}, headers=SERVER)
            assert response.status_code == 200, response.text
            answers = response.json()["results"]
        else:
            response = await client.post(path, json=bodies[0], headers=SERVER)
            answers = [response.json()]
            if response.status_code != 200:
                answers = [{"event_id": bodies[0]["event_id"], "error": answers[0]}]
        for body, want, got in zip(bodies, wants, answers, strict=True):
            if isinstance(want, tuple):  # the second time in its batch: the first's answer
                assert got == {**answers[want[1]], "duplicate": True}, (body, got)
            elif want == "conflict":
                assert got["error"]["status"] == 409, got
            elif want == "range":
                assert got["error"]["status"] == 422, got
            elif "duplicate" in want:
                assert got == want
            else:
                assert got.get("duplicate") is False, (body, got)
                alltime = {k: v for k, v in got["periods"]["alltime"].items() if k != "period_id"}
                assert alltime == want, (body, got)
                sent.append((body, got))


async def play(client: httpx.AsyncClient, redis: Redis, keys: Keys, seed: int) -> None:
    rng = random.Random(seed)
    operator = rng.choice(["incr", "best", "set"])
    order = rng.choice(["desc", "asc"])
    sub_order = None if operator == "incr" else rng.choice([None, "asc", "desc"])
    board = Board.model_validate(
        {
            "board_id": f"audit-{seed}",
            "operator": operator,
            "order": order,
            "subscore_order": sub_order,
            "notify_top": BRACKETS,
            "periods": ["alltime"],
            "min_value": -MAX_SCORE,
            "max_value": MAX_SCORE,
        }
    )
    await add_board(redis, keys, board)
    model = Model(operator, order, sub_order)
    published: dict[str, dict[str, Any]] = {}
    await write(client, model, rng, board.board_id, published)
    team_of: dict[str, str] = {}
    await check_published(redis, keys, board.board_id, published, team_of)
    for region in REGIONS:
        expected = model.ranked(model.regions.get(region, {}))
        await check_scope(client, board.board_id, rng, f"region:{region}", expected, model.names)
    for user, friends in FRIENDS.items():
        await redis.sadd(keys.friends(user), *friends)
        for friend in friends:
            await redis.sadd(keys.friends(friend), user)
    written = datetime.now(UTC)
    await aggregate(redis, keys, board)
    await check_as_of(client, board.board_id, written)
    merged = model.merged()
    await check_scope(client, board.board_id, rng, "global", model.ranked(merged), model.names)
    for user, friends in FRIENDS.items():
        group = {u: e for u, e in merged.items() if u in {user, *friends}}
        await check_scope(client, board.board_id, rng, f"friends:{user}", model.ranked(group))
    if operator == "incr":
        await check_scope(client, board.board_id, rng, "teams", model.ranked(model.teams))
    await check_ranks(client, model, rng, board.board_id, team_of)


async def check_as_of(client: httpx.AsyncClient, board_id: str, written: datetime) -> None:
    """A region is as of the read; the global and friends scopes as of the merge, which ran
    after every write."""
    for scope in ("region:eu", "global", f"friends:{next(iter(FRIENDS))}"):
        before = datetime.now(UTC)
        response = await client.get(
            f"/v1/boards/{board_id}/leaderboard", params={"scope": scope}, headers=SERVER
        )
        after = datetime.now(UTC)
        as_of = datetime.fromisoformat(response.json()["as_of"])
        earliest = before if scope.startswith("region") else written
        # Sent to the millisecond, truncated: allow for the cut.
        assert earliest - timedelta(milliseconds=1) <= as_of <= after, (scope, as_of)


async def check_ranks(
    client: httpx.AsyncClient,
    model: Model,
    rng: random.Random,
    board_id: str,
    team_of: dict[str, str],
) -> None:
    """Every user's ranks call: its place in each region it scored in, in global, its team's
    place (the team named by its latest event that named one) and its place among its
    friends."""
    merged = model.merged()
    views = {f"region:{r}": model.ranked(b) for r, b in model.regions.items()}
    views["global"] = model.ranked(merged)
    teams = model.ranked(model.teams)
    for user in USERS:
        style = rng.choice(STYLES)
        response = await client.get(
            f"/v1/boards/{board_id}/users/{user}/ranks",
            params={"rank_style": style},
            headers=SERVER,
        )
        if user not in merged:
            assert_problem(response, 404)
            continue
        assert response.status_code == 200, response.text
        scopes = response.json()["periods"]["alltime"]["scopes"]
        group = {user, *FRIENDS.get(user, []), *(u for u, f in FRIENDS.items() if user in f)}
        own = dict(views)
        if len(group) > 1:
            own["friends"] = model.ranked({u: e for u, e in merged.items() if u in group})
        for scope, rows in own.items():
            names = [row[0] for row in rows]
            if user not in names:
                assert scope not in scopes, (user, scope)
                continue
            place = names.index(user)
            rank = styled(rows, style)[place]
            want = {"rank": rank, "score": rows[place][1], "total": len(rows)}
            assert scopes[scope] == want, (user, scope, style)
        team = team_of.get(user)
        if team is None or team not in model.teams:
            assert "teams" not in scopes, (user, model.operator, team, scopes.get("teams"))
            continue
        place = [row[0] for row in teams].index(team)
        want = {"team_id": team, "rank": styled(teams, style)[place], "score": teams[place][1]}
        assert scopes["teams"] == {**want, "total": len(teams)}, (
            user,
            style,
            scopes["teams"],
            teams,
        )


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_scores_read_as_the_contract_says(
    quiet: LadderSettings, redis: Redis, keys: Keys, seed: int
) -> None:
    loose = quiet.model_copy(update={"user_rate": 1e9, "key_rate": 1e9})
    async with api_client(loose) as client:
        await play(client, redis, keys, seed)
