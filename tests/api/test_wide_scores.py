"""Wide scores (the contract's v1.1 in docs/api.md, sections 1, 3, 4 and 5): every board, operator
and period holds any score in ±(2**53 - 1) exactly, and ties go to whoever reached the score first,
to the millisecond, on every period, all-time included, in the regions and in the merged global
view.

Black-box: boards are made with ``PUT /v1/boards/{id}``, scores sent and read over HTTP, friends
made over HTTP. The API runs in-process against real Redis and MySQL with an unreachable broker,
so the accepted events wait in the outbox; where a test needs the global view it runs one merge
itself, as the aggregator would (tests/api/test_reads.py's ``merge``).

The cases marked ``narrow`` are controls: the same checks at magnitudes and spacings today's
layout already holds (scores within ±8,388,607, ties a second apart), so that a failure of the
``wide`` case says something about the layout and not about the test.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.boards import BoardCatalog
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem, rfc
from tests.api.test_reads import merge
from tests.helpers import ADMIN, SERVER, api_client, snapshot

BIG = 2**53 - 1
WIDE = {"min_value": -BIG, "max_value": BIG}
NARROW = {"min_value": -8_388_607, "max_value": 8_388_607}
PERIODS = ("daily", "weekly", "monthly", "alltime")
STYLES = ("ordinal", "competition", "dense")
KINDS = [("incr", "desc"), ("incr", "asc"), ("best", "desc"), ("best", "asc")]
KINDS += [("set", "desc"), ("set", "asc")]
LEAD = timedelta(seconds=10)


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database (boards and friends are
    written to MySQL)."""
    return quiet


def moment(span: timedelta = timedelta(seconds=40)) -> datetime:
    """A past moment, half-way through its second, such that everything from ``LEAD`` before it
    to ``span`` after it lies in one UTC day (so in one week and one month), well within the
    allowed lateness."""
    start = (datetime.now(UTC) - timedelta(seconds=150)).replace(microsecond=500_000)
    if (start - LEAD).date() != (start + span).date():
        midnight = datetime.combine((start + span).date(), time(), tzinfo=UTC)
        start = midnight + LEAD + timedelta(milliseconds=500)
    return start


async def put_board(client: httpx.AsyncClient, board_id: str, **fields: Any) -> dict[str, Any]:
    """A new board (201); the stored definition, which must carry every field as sent."""
    response = await client.put(f"/v1/boards/{board_id}", json=fields, headers=ADMIN)
    assert response.status_code == 201, response.text
    stored: dict[str, Any] = response.json()
    assert {k: stored[k] for k in fields} == fields
    return stored


async def send(
    client: httpx.AsyncClient, board: str, user_id: str, value: int, at: datetime, **more: Any
) -> dict[str, Any]:
    """A score that must be accepted; its answer."""
    body = {"user_id": user_id, "value": value, "occurred_at": rfc(at), "region": "eu"} | more
    response = await client.post(f"/v1/boards/{board}/scores", json=body, headers=SERVER)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def read(client: httpx.AsyncClient, path: str, **params: Any) -> dict[str, Any]:
    response = await client.get(path, params=params, headers=SERVER)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def befriend(client: httpx.AsyncClient, user_id: str, *friend_ids: str) -> None:
    for friend_id in friend_ids:
        response = await client.put(f"/v1/users/{user_id}/friends/{friend_id}", headers=SERVER)
        assert response.status_code == 204, response.text


async def merge_board(redis: Redis, keys: Keys, board_id: str) -> None:
    """One merge of the board into the global view, as the aggregator makes it."""
    board = await BoardCatalog(redis, keys).get(board_id, fresh=True)
    assert board is not None
    await merge(redis, keys, board)


def exact(value: Any) -> Any:
    """A score as read, checked to be a JSON integer (``1e12`` or ``1000000000000.0`` is not)."""
    assert type(value) is int, f"{value!r} is not an integer"
    return value


def table(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["rank"], e.get("user_id", e.get("team_id")), exact(e["score"])) for e in entries]


async def page(
    client: httpx.AsyncClient, board: str, scope: str, period: str, period_id: str, **more: Any
) -> list[tuple[Any, ...]]:
    path = f"/v1/boards/{board}/leaderboard"
    body = await read(client, path, scope=scope, period=period, period_id=period_id, **more)
    return table(body["entries"])


async def walk(
    client: httpx.AsyncClient, board: str, limit: int, **params: Any
) -> list[list[tuple[Any, ...]]]:
    """Every page of a view, following ``next_cursor`` to the end."""
    pages: list[list[tuple[Any, ...]]] = []
    cursor = None
    while True:
        query = params | {"limit": limit} | ({"cursor": cursor} if cursor else {})
        body = await read(client, f"/v1/boards/{board}/leaderboard", **query)
        pages.append(table(body["entries"]))
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "the cursor does not end"


# --- board definitions -------------------------------------------------------------------------


async def test_boards_bounded_anywhere_in_the_wide_range_are_accepted(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        for operator, order in KINDS:
            board_id = f"{operator}-{order}"
            await put_board(client, board_id, operator=operator, order=order, **WIDE)
            stored = await read(client, f"/v1/boards/{board_id}")
            assert (stored["min_value"], stored["max_value"]) == (-BIG, BIG)
            assert (type(stored["min_value"]), type(stored["max_value"])) == (int, int)
        # Bounds anywhere inside the range, not only at its ends.
        await put_board(client, "tera", min_value=10**12, max_value=10**15)


@pytest.mark.parametrize(
    "bounds",
    [
        pytest.param({"max_value": 2**53}, id="max-2**53"),
        pytest.param({"min_value": -(2**53)}, id="min--2**53"),
        pytest.param({"min_value": -(2**63), "max_value": 2**63}, id="int64"),
    ],
)
async def test_a_board_bounded_beyond_the_wide_range_is_refused(
    quiet: LadderSettings, redis: Redis, bounds: dict[str, int]
) -> None:
    """Passes on today's code too (its bounds are narrower still)."""
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        refused = await client.put("/v1/boards/huge", json=bounds, headers=ADMIN)
        after = await snapshot(redis, quiet.key_prefix)
        missing = await client.get("/v1/boards/huge", headers=SERVER)

    assert_problem(refused, 422)
    assert after == before
    assert_problem(missing, 404)


# --- exact values on every period and scope ----------------------------------------------------


@dataclass(frozen=True)
class Player:
    user_id: str
    region: str
    team_id: str
    value: int


def spread(high: int, mid: int, low: int) -> list[Player]:
    """Three players, in the order they write: the highest value and the lowest in eu, the
    middle one in na, each in a team of its own."""
    return [
        Player("u-high", "eu", "red", high),
        Player("u-mid", "na", "blue", mid),
        Player("u-low", "eu", "green", low),
    ]


MAGNITUDES = [
    pytest.param((WIDE, spread(BIG, 10**12, -BIG)), id="wide"),
    pytest.param((NARROW, spread(8_388_607, 1_000_000, -8_388_607)), id="narrow"),
]
FRIENDS = {"u-high": {"u-mid"}, "u-mid": {"u-high", "u-low"}, "u-low": {"u-mid"}}


def ranked(players: list[Player], descending: bool) -> list[Player]:
    return sorted(players, key=lambda p: p.value, reverse=descending)


def expected_scopes(players: list[Player], who: Player, descending: bool) -> dict[str, list[Any]]:
    """The members of each scope ``who`` belongs to, in board order."""
    order = ranked(players, descending)
    group = FRIENDS[who.user_id] | {who.user_id}
    return {
        f"region:{who.region}": [p for p in order if p.region == who.region],
        "global": order,
        f"friends:{who.user_id}": [p for p in order if p.user_id in group],
    }


async def observe_views(
    client: httpx.AsyncClient, board: str, players: list[Player], ids: dict[str, str], desc: bool
) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Every page and standing of every period and scope, read and expected."""
    seen: dict[Any, Any] = {}
    want: dict[Any, Any] = {}
    for period, period_id in ids.items():
        for who in players:
            for scope, members in expected_scopes(players, who, desc).items():
                rows = [(i + 1, p.user_id, p.value) for i, p in enumerate(members)]
                seen[period, scope] = await page(client, board, scope, period, period_id)
                want[period, scope] = rows
                path = f"/v1/boards/{board}/users/{who.user_id}"
                standing = await read(
                    client, path, scope=scope, period=period, period_id=period_id, around=3
                )
                seen[period, scope, who.user_id] = (
                    standing["rank"],
                    exact(standing["score"]),
                    standing["total"],
                    table(standing["around"]),
                )
                rank = [p.user_id for p in members].index(who.user_id) + 1
                want[period, scope, who.user_id] = (rank, who.value, len(members), rows)
        if board.startswith("incr"):
            seen[period, "teams"] = await page(client, board, "teams", period, period_id)
            want[period, "teams"] = [
                (i + 1, p.team_id, p.value) for i, p in enumerate(ranked(players, desc))
            ]
    return seen, want


async def observe_ranks(
    client: httpx.AsyncClient, board: str, players: list[Player], ids: dict[str, str], desc: bool
) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The ranks call of every player, read and expected."""
    seen: dict[Any, Any] = {}
    want: dict[Any, Any] = {}
    for who in players:
        path = f"/v1/boards/{board}/users/{who.user_id}/ranks"
        answer = await read(client, path, period_id=list(ids.values()))
        scopes = expected_scopes(players, who, desc)
        expected: dict[str, Any] = {}
        for scope, members in scopes.items():
            rank = [p.user_id for p in members].index(who.user_id) + 1
            name = "friends" if scope.startswith("friends:") else scope
            expected[name] = {"rank": rank, "score": who.value, "total": len(members)}
        if board.startswith("incr"):
            rank = [p.user_id for p in ranked(players, desc)].index(who.user_id) + 1
            expected["teams"] = {
                "team_id": who.team_id,
                "rank": rank,
                "score": who.value,
                "total": len(players),
            }
        for period, period_id in ids.items():
            got = answer["periods"][period]
            for entry in got["scopes"].values():
                exact(entry["score"])
            seen[who.user_id, period] = (got["period_id"], got["scopes"])
            want[who.user_id, period] = (period_id, expected)
    return seen, want


@pytest.mark.parametrize(("operator", "order"), KINDS)
@pytest.mark.parametrize("magnitude", MAGNITUDES)
async def test_the_widest_values_read_back_exactly_on_every_period_and_scope(
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    operator: str,
    order: str,
    magnitude: tuple[dict[str, int], list[Player]],
) -> None:
    bounds, players = magnitude
    board, desc = f"{operator}-{order}", order == "desc"
    start = moment()
    async with api_client(quiet) as client:
        await put_board(client, board, operator=operator, order=order, **bounds)
        answers = {}
        for i, p in enumerate(players):
            answers[p.user_id] = await send(
                client,
                board,
                p.user_id,
                p.value,
                start + timedelta(seconds=i),
                region=p.region,
                team_id=p.team_id,
            )
        await befriend(client, "u-mid", "u-high", "u-low")
        await merge_board(redis, keys, board)
        ids = {p: answers["u-high"]["periods"][p]["period_id"] for p in PERIODS}
        views = await observe_views(client, board, players, ids, desc)
        ranks = await observe_ranks(client, board, players, ids, desc)

    for i, p in enumerate(players):
        # The rank in its region among those who had written by then.
        ahead = [q for q in ranked(players[: i + 1], desc) if q.region == p.region]
        rank = [q.user_id for q in ahead].index(p.user_id) + 1
        got = answers[p.user_id]["periods"]
        assert {k: (exact(v["score"]), v["rank"]) for k, v in got.items()} == {
            k: (p.value, rank) for k in PERIODS
        }, p
    assert views[0] == views[1]
    assert ranks[0] == ranks[1]


# --- what leaves the range is refused ----------------------------------------------------------


async def test_values_past_the_wide_range_are_refused_and_change_nothing(
    quiet: LadderSettings, redis: Redis
) -> None:
    start = moment()
    async with api_client(quiet) as client:
        for operator, order in KINDS:
            board = f"{operator}-{order}"
            await put_board(client, board, operator=operator, order=order, **WIDE)
            await send(client, board, "u-1", 10**12, start)
        before = await snapshot(redis, quiet.key_prefix)
        refused = []
        for operator, order in KINDS:
            for value in (2**53, -(2**53), 2**63):
                body = {"user_id": "u-1", "region": "eu", "value": value}
                refused.append(
                    await client.post(
                        f"/v1/boards/{operator}-{order}/scores", json=body, headers=SERVER
                    )
                )
        after = await snapshot(redis, quiet.key_prefix)
        readback = await read(client, "/v1/boards/incr-desc/users/u-1", scope="region:eu")

    for response in refused:
        assert_problem(response, 422)
    assert after == before
    assert exact(readback["score"]) == 10**12


async def test_an_incr_total_that_would_leave_the_wide_range_is_refused(
    quiet: LadderSettings, redis: Redis
) -> None:
    start = moment()
    at = [start + timedelta(milliseconds=i) for i in range(10)]
    async with api_client(quiet) as client:
        await put_board(client, "xp", operator="incr", **WIDE)
        await send(client, "xp", "u-top", BIG - 10, at[0])
        to_the_top = await send(client, "xp", "u-top", 10, at[1])
        await send(client, "xp", "u-bottom", -BIG + 3, at[2])
        to_the_bottom = await send(client, "xp", "u-bottom", -3, at[3])
        await send(client, "xp", "u-small", 1, at[4])
        before = await snapshot(redis, quiet.key_prefix)
        refused = []
        for user_id, value in (("u-top", 1), ("u-bottom", -1), ("u-small", BIG), ("u-top", BIG)):
            body = {"user_id": user_id, "region": "eu", "value": value, "occurred_at": rfc(at[5])}
            refused.append(await client.post("/v1/boards/xp/scores", json=body, headers=SERVER))
        after = await snapshot(redis, quiet.key_prefix)
        # In a batch, the event that would leave the range is refused on its own.
        events = [
            {"event_id": "ok", "user_id": "u-small", "region": "eu", "value": 2},
            {"event_id": "over", "user_id": "u-top", "region": "eu", "value": 1},
        ]
        batch = await client.post(
            "/v1/boards/xp/scores/batch", json={"events": events}, headers=SERVER
        )
        ids = {p: to_the_top["periods"][p]["period_id"] for p in PERIODS}
        pages = {p: await page(client, "xp", "region:eu", p, ids[p]) for p in PERIODS}

    for period in PERIODS:
        assert exact(to_the_top["periods"][period]["score"]) == BIG
        assert exact(to_the_bottom["periods"][period]["score"]) == -BIG
    for response in refused:
        assert_problem(response, 422)
    assert after == before
    assert batch.status_code == 200, batch.text
    ok, over = batch.json()["results"]
    assert ok["periods"]["alltime"]["score"] == 3
    assert (over["event_id"], over["error"]["status"]) == ("over", 422)
    for period in PERIODS:
        # u-small's batch event counts toward the current periods, which may have turned over.
        assert pages[period][0] == (1, "u-top", BIG), period
        assert pages[period][2] == (3, "u-bottom", -BIG), period
    assert pages["alltime"][1] == (2, "u-small", 3)


# --- ties go to whoever reached the score first ------------------------------------------------

TIES = [
    pytest.param((WIDE, 5 * 10**14, timedelta(milliseconds=1)), id="wide-1ms"),
    pytest.param((NARROW, 5_000, timedelta(seconds=1)), id="narrow-1s"),
]


def first_step(operator: str, desc: bool, tie: int) -> int:
    """A value that leaves a user short of ``tie``, from which the next write reaches it."""
    if operator == "incr" or desc:
        return tie // 5
    return tie + tie // 5  # worse on an ascending board, so that a best write improves on it


async def write_ties(
    client: httpx.AsyncClient, board: str, operator: str, desc: bool, tie: int, step: timedelta
) -> dict[str, dict[str, Any]]:
    """Five users: ``tie-m``, ``tie-z`` and ``tie-a`` reach ``tie`` in that order, ``step``
    apart (neither user id order); ``lead`` is one better and reaches it last, ``tail`` one
    worse and reaches it first. ``tie-z`` wrote before any of them but reached ``tie`` second.
    eu holds tie-m, tie-a and tail; na holds tie-z and lead. The answers, by user."""
    start = moment()
    better = 1 if desc else -1
    reach = tie - first_step(operator, desc, tie) if operator == "incr" else tie
    writes = [
        ("tail", "eu", tie - better, start - timedelta(seconds=6)),
        ("tie-z", "na", first_step(operator, desc, tie), start - timedelta(seconds=5)),
        ("tie-m", "eu", tie, start),
        ("tie-z", "na", reach, start + step),
        ("tie-a", "eu", tie, start + 2 * step),
        ("lead", "na", tie + better, start + 3 * step),
    ]
    return {u: await send(client, board, u, v, at, region=r) for u, r, v, at in writes}


@pytest.mark.parametrize(("operator", "order"), KINDS)
@pytest.mark.parametrize("ties", TIES)
async def test_ties_go_to_whoever_reached_the_score_first(
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    operator: str,
    order: str,
    ties: tuple[dict[str, int], int, timedelta],
) -> None:
    bounds, tie, step = ties
    board, desc = f"{operator}-{order}", order == "desc"
    better = 1 if desc else -1
    async with api_client(quiet) as client:
        await put_board(client, board, operator=operator, order=order, **bounds)
        answers = await write_ties(client, board, operator, desc, tie, step)
        await merge_board(redis, keys, board)
        ids = {p: answers["tie-m"]["periods"][p]["period_id"] for p in PERIODS}
        seen = {
            (period, scope, style): await page(
                client, board, scope, period, ids[period], rank_style=style
            )
            for period in PERIODS
            for scope in ("region:eu", "region:na", "global")
            for style in STYLES
        }
        standings = {
            (period, scope, user): (
                await read(
                    client,
                    f"/v1/boards/{board}/users/{user}",
                    scope=scope,
                    period=period,
                    period_id=ids[period],
                    rank_style=style,
                )
            )["rank"]
            for period in PERIODS
            for scope, user, style in (
                ("global", "tie-z", "ordinal"),
                ("global", "tie-a", "competition"),
                ("region:eu", "tie-a", "ordinal"),
            )
        }
        profile = await read(
            client, f"/v1/boards/{board}/users/tie-z/ranks", period_id=list(ids.values())
        )

    scores = {"lead": tie + better, "tail": tie - better}
    order_of = {
        "region:eu": ["tie-m", "tie-a", "tail"],
        "region:na": ["lead", "tie-z"],
        "global": ["lead", "tie-m", "tie-z", "tie-a", "tail"],
    }
    styled = {
        "region:eu": {"ordinal": [1, 2, 3], "competition": [1, 1, 3], "dense": [1, 1, 2]},
        "region:na": {style: [1, 2] for style in STYLES},
        "global": {
            "ordinal": [1, 2, 3, 4, 5],
            "competition": [1, 2, 2, 2, 5],
            "dense": [1, 2, 2, 2, 3],
        },
    }
    want = {
        (period, scope, style): [
            (rank, user, scores.get(user, tie))
            for rank, user in zip(styled[scope][style], users, strict=True)
        ]
        for period in PERIODS
        for scope, users in order_of.items()
        for style in STYLES
    }
    assert seen == want
    assert standings == {
        (period, scope, user): rank
        for period in PERIODS
        for scope, user, rank in (
            ("global", "tie-z", 3),
            ("global", "tie-a", 2),
            ("region:eu", "tie-a", 2),
        )
    }
    for period in PERIODS:
        assert (
            answers["tie-m"]["periods"][period]["rank"],
            answers["tie-a"]["periods"][period]["rank"],
        ) == (1, 2)
        assert exact(answers["tie-z"]["periods"][period]["score"]) == tie
        assert profile["periods"][period]["scopes"] == {
            "region:na": {"rank": 2, "score": tie, "total": 2},
            "global": {"rank": 3, "score": tie, "total": 5},
        }


@pytest.mark.parametrize(
    ("bounds", "high", "low"),
    [
        pytest.param({}, 40, 30, id="main-bounds"),
        pytest.param(WIDE, 10**12, -(10**12), id="wide"),
    ],
)
async def test_two_alltime_scores_a_millisecond_apart_rank_the_earlier_first(
    quiet: LadderSettings, redis: Redis, keys: Keys, bounds: dict[str, int], high: int, low: int
) -> None:
    """Two pairs, each reached a millisecond apart within one second: in the first the earlier
    user has the smaller id, in the second the greater, so no order by user id passes both."""
    start = moment()
    writes = [("c-a", high), ("c-b", high), ("c-d", low), ("c-c", low)]
    async with api_client(quiet) as client:
        await put_board(client, "forever", periods=["alltime"], **bounds)
        answers = [
            await send(client, "forever", user, value, start + timedelta(milliseconds=i))
            for i, (user, value) in enumerate(writes)
        ]
        await merge_board(redis, keys, "forever")
        region = await page(client, "forever", "region:eu", "alltime", "all")
        merged = await page(client, "forever", "global", "alltime", "all")
        standing = await read(client, "/v1/boards/forever/users/c-c", scope="global")

    want = [(i + 1, user, value) for i, (user, value) in enumerate(writes)]
    assert [a["periods"]["alltime"]["rank"] for a in answers] == [1, 2, 3, 4]
    assert region == want
    assert merged == want
    assert (standing["rank"], exact(standing["score"])) == (4, low)


# --- an incr total past 10**12, merged across regions ------------------------------------------


async def test_an_incr_total_grows_past_a_trillion_and_merges_exactly(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """u-1 adds up in eu and in na; u-2, in eu alone, ends one below u-1's global sum. Then u-2
    adds 2 and a second merge puts it one above."""
    start = moment()
    u1_eu = [999_999_999_999, 1, -1, 123_456_789_013]  # 1_123_456_789_012
    u1_na = [2**40 + 3, 5]  # 1_099_511_627_784
    u1_total = sum(u1_eu) + sum(u1_na)  # 2_222_968_416_796
    writes = [("u-1", "eu", v) for v in u1_eu] + [("u-1", "na", v) for v in u1_na]
    writes += [("u-2", "eu", 2 * 10**12), ("u-2", "eu", u1_total - 1 - 2 * 10**12)]
    async with api_client(quiet) as client:
        await put_board(client, "xp", operator="incr", **WIDE)
        answers = []
        for i, (user, region, value) in enumerate(writes):
            at = start + timedelta(milliseconds=10 * i)
            team = {"u-1": "red", "u-2": "blue"}[user]
            answers.append(await send(client, "xp", user, value, at, region=region, team_id=team))
        await merge_board(redis, keys, "xp")
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        first = {
            (p, scope): await page(client, "xp", scope, p, ids[p])
            for p in PERIODS
            for scope in ("global", "region:eu", "region:na", "teams")
        }
        await send(client, "xp", "u-2", 2, start + timedelta(seconds=1), team_id="blue")
        await merge_board(redis, keys, "xp")
        second = {p: await page(client, "xp", "global", p, ids[p]) for p in PERIODS}
        standing = await read(client, "/v1/boards/xp/users/u-1", scope="global")
        profile = await read(client, "/v1/boards/xp/users/u-1/ranks", period_id=list(ids.values()))

    running: dict[tuple[str, str], int] = {}
    for (user, region, value), answer in zip(writes, answers, strict=True):
        running[user, region] = running.get((user, region), 0) + value
        for period in PERIODS:
            assert exact(answer["periods"][period]["score"]) == running[user, region]
    u1_eu_total = sum(u1_eu)
    for period in PERIODS:
        assert first[period, "global"] == [(1, "u-1", u1_total), (2, "u-2", u1_total - 1)]
        assert first[period, "region:eu"] == [(1, "u-2", u1_total - 1), (2, "u-1", u1_eu_total)]
        assert first[period, "region:na"] == [(1, "u-1", sum(u1_na))]
        assert first[period, "teams"] == [(1, "red", u1_total), (2, "blue", u1_total - 1)]
        assert second[period] == [(1, "u-2", u1_total + 1), (2, "u-1", u1_total)]
        assert profile["periods"][period]["scopes"]["global"] == {
            "rank": 2,
            "score": u1_total,
            "total": 2,
        }
    assert (standing["rank"], exact(standing["score"])) == (2, u1_total)


# --- cursors through a tie group ---------------------------------------------------------------

GROUPS = [
    pytest.param((WIDE, BIG, timedelta(milliseconds=1)), id="wide-1ms"),
    pytest.param((NARROW, 1_000, timedelta(seconds=1)), id="narrow-1s"),
]


@pytest.mark.parametrize("group", GROUPS)
async def test_cursors_page_through_a_tie_group_in_reach_order(
    quiet: LadderSettings, redis: Redis, keys: Keys, group: tuple[dict[str, int], int, timedelta]
) -> None:
    """30 users tie at one score, reached ``step`` apart in an order that is not their ids'; two
    more sit one below, reached before all of them. Pages of 7, every period, region and global,
    every rank style: each user once, in reach order."""
    bounds, tie, step = group
    start = moment()
    tied = [f"p-{(i * 11) % 30:02d}" for i in range(30)]
    below = [("q-1", start - timedelta(seconds=2)), ("q-0", start - timedelta(seconds=1))]
    async with api_client(quiet) as client:
        await put_board(client, "crowd", operator="set", **bounds)
        answers = [await send(client, "crowd", user, tie - 1, at) for user, at in below]
        for i, user in enumerate(tied):
            answers.append(await send(client, "crowd", user, tie, start + i * step))
        await merge_board(redis, keys, "crowd")
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        walks = {
            (period, scope, style): await walk(
                client,
                "crowd",
                7,
                scope=scope,
                period=period,
                period_id=ids[period],
                rank_style=style,
            )
            for period in PERIODS
            for scope in ("region:eu", "global")
            for style in STYLES
        }
        middle = await read(client, f"/v1/boards/crowd/users/{tied[15]}", scope="global", around=2)

    users = [*tied, "q-1", "q-0"]
    scores = [tie] * 30 + [tie - 1] * 2
    ranks = {
        "ordinal": list(range(1, 33)),
        "competition": [1] * 30 + [31, 31],
        "dense": [1] * 30 + [2, 2],
    }
    for (period, scope, style), pages in walks.items():
        assert [len(p) for p in pages] == [7, 7, 7, 7, 4], (period, scope, style)
        got = [row for p in pages for row in p]
        assert got == list(zip(ranks[style], users, scores, strict=True)), (period, scope, style)
    assert middle["rank"] == 16
    assert [e["user_id"] for e in middle["around"]] == tied[13:18]
