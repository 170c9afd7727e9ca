"""Subscores on the write side (the contract's v1.1 in docs/api.md, sections 3 and 4): which boards
take a ``subscore_order`` and when it may change; which ``best`` write improves (a better (score,
subscore) pair, nothing else) and what a ``set`` write replaces; and which writes are refused (a
subscore missing on a subscore board, given on another, beyond ±(2**53 - 1) or no integer), a
refused write changing nothing.

Black-box over HTTP, as tests/api/test_subscores.py (the orders themselves).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.api.test_subscores import page_of
from tests.api.test_wide_scores import merge_board, moment, put_board, read, send
from tests.helpers import ADMIN, SERVER, api_client, snapshot

PERIODS = ("daily", "weekly", "monthly", "alltime")
ORDERS = [(order, sub) for order in ("desc", "asc") for sub in ("desc", "asc")]


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database (boards are written to
    MySQL)."""
    return quiet


# --- board definitions -------------------------------------------------------------------------


async def test_best_and_set_boards_take_a_subscore_order_and_incr_boards_refuse_one(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        for operator in ("best", "set"):
            for sub_order in ("desc", "asc"):
                board = f"{operator}-{sub_order}"
                await put_board(client, board, operator=operator, subscore_order=sub_order)
                stored = await read(client, f"/v1/boards/{board}")
                assert (stored["operator"], stored["subscore_order"]) == (operator, sub_order)
        plain = await put_board(client, "plain", operator="best")
        refused = {
            "incr": await client.put(
                "/v1/boards/xp", json={"operator": "incr", "subscore_order": "desc"}, headers=ADMIN
            ),
            "default-incr": await client.put(
                "/v1/boards/xp", json={"subscore_order": "asc"}, headers=ADMIN
            ),
            "unknown": await client.put(
                "/v1/boards/xp", json={"operator": "best", "subscore_order": "up"}, headers=ADMIN
            ),
        }
        missing = await client.get("/v1/boards/xp", headers=SERVER)

    assert plain["subscore_order"] is None
    for response in refused.values():
        assert_problem(response, 422)
    assert_problem(missing, 404)


async def test_the_subscore_order_is_fixed_once_a_board_has_scores(
    quiet: LadderSettings,
) -> None:
    race = {"operator": "best", "order": "asc", "subscore_order": "desc"}
    async with api_client(quiet) as client:
        await put_board(client, "race", **race)
        # No scores yet: any change is allowed.
        for sub_order in ("asc", None, "desc"):
            response = await client.put(
                "/v1/boards/race", json=race | {"subscore_order": sub_order}, headers=ADMIN
            )
            assert response.status_code == 200, response.text
        await put_board(client, "plain", operator="set")
        await send(client, "race", "u-1", 90, moment(), subscore=3)
        await send(client, "plain", "u-1", 90, moment())
        refused = [
            await client.put("/v1/boards/race", json=race | {"subscore_order": s}, headers=ADMIN)
            for s in ("asc", None)
        ]
        refused.append(
            await client.put(
                "/v1/boards/plain",
                json={"operator": "set", "subscore_order": "desc"},
                headers=ADMIN,
            )
        )
        # Any other field may still change.
        other = await client.put("/v1/boards/race", json=race | {"notify_top": [3]}, headers=ADMIN)
        stored = {b: await read(client, f"/v1/boards/{b}") for b in ("race", "plain")}

    for response in refused:
        assert "subscore_order" in assert_problem(response, 409)["detail"]
    assert other.status_code == 200, other.text
    assert (stored["race"]["subscore_order"], stored["race"]["notify_top"]) == ("desc", [3])
    assert stored["plain"]["subscore_order"] is None


# --- which write improves ----------------------------------------------------------------------

# Steps of users p, q and r in eu, 1 ms apart: who writes; its score as 100 plus this many steps
# in the board's better direction; its subscore as this many steps in the subscore's better
# direction; then what the answer must say: improved, the rank, and the score kept.
BEST_STEPS = [
    ("p", 0, 0, True, 1, 0),
    ("q", 0, 5, True, 1, 0),  # the same score, a better subscore: ahead of p
    ("p", 0, 0, False, 2, 0),  # its own pair again
    ("p", 0, -5, False, 2, 0),  # the same score, a worse subscore
    ("p", -1, 50, False, 2, 0),  # a worse score, however good the subscore
    ("r", 0, 5, True, 2, 0),  # q's pair, reached later
    ("p", 0, 5, True, 3, 0),  # a better subscore: the same pair as q and r, reached last
    ("q", 0, 5, False, 1, 0),  # its pair again: q keeps the time it first reached it
    ("r", 1, -50, True, 1, 1),  # a better score, however bad the subscore
]
BEST_FINAL = [("r", 1, -50), ("q", 0, 5), ("p", 0, 5)]
# The same for a set board: every write replaces the entry; its own pair again changes nothing.
SET_STEPS = [
    ("p", 0, 0, True, 1, 0),
    ("q", 0, 0, True, 2, 0),
    ("p", 0, 0, False, 1, 0),  # its own pair again: p keeps the time it reached it
    ("p", 0, -5, True, 2, 0),  # a worse subscore replaces the better one
    ("q", -1, 50, True, 2, -1),  # so does a worse score
    ("p", 0, 0, True, 1, 0),
    ("r", 0, 0, True, 2, 0),  # p's pair, reached after p reached it again
]
SET_FINAL = [("p", 0, 0), ("r", 0, 0), ("q", -1, 50)]
STEPS = {"best": (BEST_STEPS, BEST_FINAL), "set": (SET_STEPS, SET_FINAL)}


@pytest.mark.parametrize("operator", ["best", "set"])
@pytest.mark.parametrize(("order", "sub_order"), ORDERS)
async def test_a_best_write_improves_only_on_a_better_pair_and_a_set_write_replaces_it(
    quiet: LadderSettings, redis: Redis, keys: Keys, operator: str, order: str, sub_order: str
) -> None:
    board = f"{operator}-{order}-{sub_order}"
    up, sup = (1 if order == "desc" else -1), (1 if sub_order == "desc" else -1)
    steps, final = STEPS[operator]
    start = moment()
    async with api_client(quiet) as client:
        await put_board(client, board, operator=operator, order=order, subscore_order=sub_order)
        answers = [
            await send(
                client,
                board,
                user,
                100 + off * up,
                start + timedelta(milliseconds=i),
                subscore=s * sup,
            )
            for i, (user, off, s, *_) in enumerate(steps)
        ]
        await merge_board(redis, keys, board)
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        pages = {
            (period, scope): await page_of(client, board, scope, period, ids[period])
            for period in PERIODS
            for scope in ("region:eu", "global")
        }
        last = final[-1][0]
        standing = await read(client, f"/v1/boards/{board}/users/{last}", scope="global")

    for i, ((user, *_, improved, rank, kept), answer) in enumerate(
        zip(steps, answers, strict=True)
    ):
        for period in PERIODS:
            got = answer["periods"][period]
            assert (got["improved"], got["rank"], got["score"]) == (
                improved,
                rank,
                100 + kept * up,
            ), (i, user, period)
    want = [(i + 1, u, 100 + off * up, s * sup) for i, (u, off, s) in enumerate(final)]
    assert pages == {key: want for key in pages}
    rank, _, score, sub = want[-1]
    assert (standing["rank"], standing["score"], standing["subscore"]) == (rank, score, sub)


# --- refusals ----------------------------------------------------------------------------------

REFUSED = [
    pytest.param("race", {}, id="missing-on-a-subscore-board"),
    pytest.param("race", {"subscore": None}, id="null-on-a-subscore-board"),
    pytest.param("race", {"subscore": 2**53}, id="above-the-range"),
    pytest.param("race", {"subscore": -(2**53)}, id="below-the-range"),
    pytest.param("race", {"subscore": 1.5}, id="a-fraction"),
    pytest.param("race", {"subscore": "3"}, id="a-string"),
    pytest.param("plain", {"subscore": 3}, id="on-a-best-board-without-subscore-order"),
    pytest.param("plain", {"subscore": 0}, id="zero-on-a-best-board-without-subscore-order"),
    pytest.param("xp", {"subscore": 3}, id="on-an-incr-board"),
]


async def make_refusal_boards(client: Any) -> None:
    """Boards race (best, asc, subscore desc), plain (best) and xp (incr), u-1 scored on each."""
    await put_board(client, "race", operator="best", order="asc", subscore_order="desc")
    await put_board(client, "plain", operator="best")
    await put_board(client, "xp", operator="incr")
    at = moment()
    await send(client, "race", "u-1", 60, at, subscore=10)
    await send(client, "plain", "u-1", 60, at)
    await send(client, "xp", "u-1", 60, at)


@pytest.mark.parametrize(("board", "extra"), REFUSED)
async def test_a_refused_subscore_writes_nothing(
    quiet: LadderSettings, redis: Redis, board: str, extra: dict[str, Any]
) -> None:
    body = {"user_id": "u-1", "region": "eu", "value": 50} | extra
    async with api_client(quiet) as client:
        await make_refusal_boards(client)
        before_read = await read(client, f"/v1/boards/{board}/leaderboard", scope="region:eu")
        before = await snapshot(redis, quiet.key_prefix)
        refused = await client.post(f"/v1/boards/{board}/scores", json=body, headers=SERVER)
        after = await snapshot(redis, quiet.key_prefix)
        after_read = await read(client, f"/v1/boards/{board}/leaderboard", scope="region:eu")

    problem = assert_problem(refused, 422)
    assert any("subscore" in map(str, e["loc"]) for e in problem["errors"]), problem
    assert after == before
    assert after_read["entries"] == before_read["entries"]
    assert [e["score"] for e in after_read["entries"]] == [60]


async def test_a_batch_refuses_only_its_events_with_a_bad_subscore(
    quiet: LadderSettings,
) -> None:
    race = [
        {"event_id": "ok", "user_id": "u-2", "region": "eu", "value": 7, "subscore": -3},
        {"event_id": "missing", "user_id": "u-3", "region": "eu", "value": 7},
        {"event_id": "over", "user_id": "u-4", "region": "eu", "value": 7, "subscore": 2**53},
    ]
    plain = [
        {"event_id": "given", "user_id": "u-5", "region": "eu", "value": 7, "subscore": 1},
        {"event_id": "fine", "user_id": "u-6", "region": "eu", "value": 7},
    ]
    async with api_client(quiet) as client:
        await make_refusal_boards(client)
        answers = {}
        for board, events in (("race", race), ("plain", plain)):
            response = await client.post(
                f"/v1/boards/{board}/scores/batch", json={"events": events}, headers=SERVER
            )
            assert response.status_code == 200, response.text
            answers[board] = response.json()["results"]
        race_page = await read(client, "/v1/boards/race/leaderboard", scope="region:eu")
        plain_page = await read(client, "/v1/boards/plain/leaderboard", scope="region:eu")

    status = {b: [r.get("error", {}).get("status", 200) for r in rs] for b, rs in answers.items()}
    assert status == {"race": [200, 422, 422], "plain": [422, 200]}
    assert [r["event_id"] for r in answers["race"]] == ["ok", "missing", "over"]
    # An ascending board: 7 before 60.
    assert [(e["user_id"], e["score"], e["subscore"]) for e in race_page["entries"]] == [
        ("u-2", 7, -3),
        ("u-1", 60, 10),
    ]
    assert [(e["user_id"], e["score"]) for e in plain_page["entries"]] == [("u-1", 60), ("u-6", 7)]
