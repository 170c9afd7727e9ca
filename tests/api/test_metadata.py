"""Metadata (the contract's v1.1 in docs/api.md, sections 4 and 5): a score may carry a JSON object
of at most 1024 bytes, serialised compactly, kept with the entry's current score (on ``best`` boards
the write that set the best; on ``set`` and ``incr`` boards the latest write, one without metadata
clearing it) and read back exactly, as ``metadata`` (null when none), on every read that answers
entries: the leaderboard in every scope and the standing read, its ``around`` entries included.

Black-box over HTTP, as tests/api/test_wide_scores.py; one merge run by hand where a test reads
the global view.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import JSON, assert_problem
from tests.api.test_wide_scores import befriend, merge_board, moment, put_board, read, send
from tests.helpers import SERVER, api_client, snapshot

PERIODS = ("daily", "weekly", "monthly", "alltime")
LIMIT = 1024
# Every kind of board metadata is kept on: operator, and the subscore order (None: none).
BOARDS = [
    pytest.param("set", None, id="set"),
    pytest.param("best", "desc", id="best-subscore"),
    pytest.param("incr", None, id="incr"),
]
# What a game might keep with a score, and what could trip a layout up: text in any script,
# emoji, escapes, nesting, the record separator "|" (shared/ranking.py) in keys and values, an
# integer beyond 2**53 and a fraction that JSON numbers as doubles would not keep.
RICH: dict[str, Any] = {
    "name": "Zoë the ⚔️ 勇者 — Ωμέγα",
    "pipe": "a|b||c|",
    "a|b": {"nested": {"deeper": [1, "two", None, True, False, {"x": -0.5}]}},
    "escapes": 'quote " backslash \\ newline \n tab \t slash /',
    "emoji🎮": "🏆🥇",
    "big": 9007199254740993,
    "fraction": 0.1,
    "whole": 2.0,
    "empty": {"object": {}, "list": []},
}


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database (boards and friends are
    written to MySQL)."""
    return quiet


def sized(total: int, char: str) -> dict[str, Any]:
    """An object whose compact JSON (orjson: UTF-8, no spaces) is exactly ``total`` bytes,
    padded with ``char`` (1 to 4 bytes in UTF-8) and ASCII."""
    padded: dict[str, Any] = {"kit": {"hat": None, "level": 3}, "pad": ""}
    room = total - len(orjson.dumps(padded))
    count, rest = divmod(room, len(char.encode()))
    padded["pad"] = char * count + "x" * rest
    assert len(orjson.dumps(padded)) == total
    return padded


async def make_board(
    client: httpx.AsyncClient, board: str, operator: str, sub_order: str | None
) -> None:
    more = {"subscore_order": sub_order} if sub_order else {}
    await put_board(client, board, operator=operator, **more)


async def write(
    client: httpx.AsyncClient,
    board: str,
    sub_order: str | None,
    user: str,
    value: int,
    at: datetime,
    metadata: Any = None,
    **more: Any,
) -> dict[str, Any]:
    """A score that must be accepted, with ``metadata`` if not None and a subscore of 0 where
    the board needs one."""
    fields = more | ({"metadata": metadata} if metadata is not None else {})
    if sub_order and "subscore" not in fields:
        fields["subscore"] = 0
    return await send(client, board, user, value, at, **fields)


def canon(value: Any) -> str:
    """JSON text that tells apart what ``==`` does not (``True`` and ``1``, ``2`` and ``2.0``)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def kept(entries: list[dict[str, Any]], sub_order: str | None) -> dict[str, Any]:
    """Each entry's metadata by user (or team), checking that every entry has the field, and a
    subscore exactly where the board has a subscore order."""
    for entry in entries:
        assert "metadata" in entry, entry
        assert ("subscore" in entry) == (sub_order is not None), entry
    return {str(e.get("user_id", e.get("team_id"))): canon(e["metadata"]) for e in entries}


# --- every read --------------------------------------------------------------------------------


async def every_read(client: httpx.AsyncClient, board: str, ids: dict[str, str]) -> dict[Any, Any]:
    """Every entry-answering read of users m-1, m-2 and m-3 in every period: pages of both
    regions, global, m-1's friends and (incr) the teams; standings, with ``around``, of each user
    in its region and in global. Each as ``(entries, the standing body or None)``."""
    seen: dict[Any, Any] = {}
    scopes = ["region:eu", "region:na", "global", "friends:m-1"]
    if board == "incr":
        scopes.append("teams")
    for period, period_id in ids.items():
        where = {"period": period, "period_id": period_id}
        for scope in scopes:
            body = await read(client, f"/v1/boards/{board}/leaderboard", scope=scope, **where)
            seen[period, scope] = (body["entries"], None)
        for user, region in (("m-1", "eu"), ("m-2", "na"), ("m-3", "eu")):
            for scope in (f"region:{region}", "global"):
                path = f"/v1/boards/{board}/users/{user}"
                body = await read(client, path, scope=scope, around=5, **where)
                seen[period, scope, user] = (body["around"], body)
    return seen


@pytest.mark.parametrize(("operator", "sub_order"), BOARDS)
async def test_metadata_is_read_back_on_every_read(
    quiet: LadderSettings, redis: Redis, keys: Keys, operator: str, sub_order: str | None
) -> None:
    writes = [
        ("m-1", "eu", "red", 30, {"deck": "red", "level": 3}),
        ("m-2", "na", "blue", 20, None),
        ("m-3", "eu", "red", 10, RICH),
    ]
    start = moment()
    async with api_client(quiet) as client:
        await make_board(client, operator, operator, sub_order)
        await befriend(client, "m-1", "m-2", "m-3")
        answers = [
            await write(
                client, operator, sub_order, user, value, start + timedelta(milliseconds=i),
                metadata, region=region, team_id=team,
            )
            for i, (user, region, team, value, metadata) in enumerate(writes)
        ]  # fmt: skip
        await merge_board(redis, keys, operator)
        ids = {p: answers[0]["periods"][p]["period_id"] for p in PERIODS}
        seen = await every_read(client, operator, ids)

    metadata = {user: canon(m) for user, _, _, _, m in writes}
    for key, (entries, standing) in seen.items():
        if key[1] == "teams":
            # A team's entry is no one player's write: it carries the field, with no object.
            assert kept(entries, None) == {"red": "null", "blue": "null"}, key
            continue
        found = kept(entries, sub_order)
        assert found == {user: metadata[user] for user in found}, key
        assert len(found) == {"region:eu": 2, "region:na": 1}.get(key[1], 3), key
        if standing is not None:
            assert canon(standing["metadata"]) == metadata[key[2]], key
            assert ("subscore" in standing) == (sub_order is not None), key


# --- which write's metadata is kept ------------------------------------------------------------


async def held(client: httpx.AsyncClient, board: str, scope: str = "region:eu", **more: Any) -> Any:
    """u-1's metadata in a view (its standing read and its page entry, which must agree)."""
    path = f"/v1/boards/{board}"
    standing = await read(client, f"{path}/users/u-1", scope=scope, around=1, **more)
    entries = (await read(client, f"{path}/leaderboard", scope=scope, **more))["entries"]
    assert [canon(e["metadata"]) for e in entries] == [canon(standing["metadata"])]
    return standing["metadata"]


# u-1's writes on a best board: value, subscore (where the board has one), metadata, and the
# metadata kept after it. The last two only on a board with a subscore order.
BEST = [
    (10, 0, {"run": 1}, {"run": 1}),
    (5, 0, {"run": 2}, {"run": 1}),  # worse: the best's metadata stays
    (10, 0, {"run": 3}, {"run": 1}),  # equal: not a new best either
    (12, 0, None, None),  # a new best without metadata: none kept
    (15, 0, {"run": 5}, {"run": 5}),
    (15, -1, {"run": 6}, {"run": 5}),  # the same score, a worse subscore
    (15, 1, {"run": 7}, {"run": 7}),  # the same score, a better subscore: a new best
]


@pytest.mark.parametrize("sub_order", [None, "desc"])
async def test_a_best_board_keeps_the_metadata_of_the_write_that_set_the_best(
    quiet: LadderSettings, redis: Redis, keys: Keys, sub_order: str | None
) -> None:
    steps = BEST if sub_order else BEST[:5]
    start = moment()
    async with api_client(quiet) as client:
        await make_board(client, "best", "best", sub_order)
        after_each = []
        for i, (value, sub, metadata, _) in enumerate(steps):
            at = start + timedelta(milliseconds=i)
            extra = {"subscore": sub} if sub_order else {}
            await write(client, "best", sub_order, "u-1", value, at, metadata, **extra)
            after_each.append(await held(client, "best"))
        await merge_board(redis, keys, "best")
        final = [
            await held(client, "best", scope, period=period)
            for period in PERIODS
            for scope in ("region:eu", "global")
        ]

    assert after_each == [kept for *_, kept in steps]
    assert final == [steps[-1][3]] * len(final)


# u-1's writes on set and incr boards: value and metadata; the latest write's is kept.
LATEST = [
    (5, {"a": 1}),
    (5, {"a": 2}),  # set: the same value again; incr: 5 more
    (6, None),  # a write without metadata clears it
    (0, {"a": 4}),  # incr: a delta of zero is the latest write all the same
    (3, {"a": 5, "b": [1]}),
]


@pytest.mark.parametrize(
    ("operator", "sub_order"),
    [
        pytest.param("set", None, id="set"),
        pytest.param("set", "asc", id="set-subscore"),
        pytest.param("incr", None, id="incr"),
    ],
)
async def test_set_and_incr_boards_keep_the_latest_writes_metadata(
    quiet: LadderSettings, redis: Redis, keys: Keys, operator: str, sub_order: str | None
) -> None:
    start = moment()
    async with api_client(quiet) as client:
        await make_board(client, operator, operator, sub_order)
        after_each = []
        for i, (value, metadata) in enumerate(LATEST):
            at = start + timedelta(milliseconds=i)
            await write(client, operator, sub_order, "u-1", value, at, metadata, team_id="red")
            after_each.append(await held(client, operator))
        await merge_board(redis, keys, operator)
        final = [
            await held(client, operator, scope, period=period)
            for period in PERIODS
            for scope in ("region:eu", "global")
        ]

    assert after_each == [metadata for _, metadata in LATEST]
    assert final == [LATEST[-1][1]] * len(final)


# --- size and shape ----------------------------------------------------------------------------


async def refused_changes_nothing(
    client: httpx.AsyncClient, redis: Redis, prefix: str, body: dict[str, Any]
) -> httpx.Response:
    """Post ``body`` for u-1 on board ``set``, which must be refused and change nothing: the
    cache as it was, u-1 still at 1 with metadata ``{"keep": true}``. The refusal."""
    before = await snapshot(redis, prefix)
    refused = await client.post("/v1/boards/set/scores", json=body, headers=SERVER)
    assert await snapshot(redis, prefix) == before
    assert await held(client, "set") == {"keep": True}
    page = await read(client, "/v1/boards/set/leaderboard", scope="region:eu")
    assert [(e["user_id"], e["score"]) for e in page["entries"]] == [("u-1", 1)]
    return refused


@pytest.mark.parametrize("char", ["x", "é", "€", "🎮"])
async def test_metadata_of_1024_bytes_is_kept_and_of_1025_refused(
    quiet: LadderSettings, redis: Redis, char: str
) -> None:
    """Sized as orjson writes it: compact, UTF-8. The bodies are sent indented and with
    ``\\u`` escapes, which count for nothing."""
    at_limit, over = sized(LIMIT, char), sized(LIMIT + 1, char)
    body = {"user_id": "u-1", "region": "eu", "value": 2}
    async with api_client(quiet) as client:
        await make_board(client, "set", "set", None)
        await write(client, "set", None, "u-1", 1, moment(), {"keep": True})
        refused = await refused_changes_nothing(
            client, redis, quiet.key_prefix, body | {"metadata": over}
        )
        accepted = await client.post(
            "/v1/boards/set/scores",
            content=json.dumps(body | {"metadata": at_limit}, indent=2),
            headers=SERVER | JSON,
        )
        now = await held(client, "set")

    problem = assert_problem(refused, 422)
    assert any("metadata" in map(str, e["loc"]) for e in problem["errors"]), problem
    assert accepted.status_code == 200, accepted.text
    assert canon(now) == canon(at_limit)


@pytest.mark.parametrize(
    "metadata",
    [[1, 2], [{"a": 1}], "text", "{}", 42, 1.5, True],
    ids=["list", "list-of-objects", "string", "string-of-json", "integer", "fraction", "true"],
)
async def test_metadata_that_is_not_an_object_is_refused(
    quiet: LadderSettings, redis: Redis, metadata: Any
) -> None:
    body = {"user_id": "u-1", "region": "eu", "value": 2, "metadata": metadata}
    async with api_client(quiet) as client:
        await make_board(client, "set", "set", None)
        await write(client, "set", None, "u-1", 1, moment(), {"keep": True})
        refused = await refused_changes_nothing(client, redis, quiet.key_prefix, body)

    problem = assert_problem(refused, 422)
    assert any("metadata" in map(str, e["loc"]) for e in problem["errors"]), problem


async def test_metadata_sent_indented_and_escaped_reads_back_exactly(
    quiet: LadderSettings,
) -> None:
    body = {"user_id": "u-1", "region": "eu", "value": 4, "subscore": 2, "metadata": RICH}
    async with api_client(quiet) as client:
        await make_board(client, "race", "best", "asc")
        response = await client.post(
            "/v1/boards/race/scores",
            content=json.dumps(body, indent=4, ensure_ascii=True),
            headers=SERVER | JSON,
        )
        assert response.status_code == 200, response.text
        found = await held(client, "race")

    assert canon(found) == canon(RICH)


async def test_a_batch_refuses_only_its_events_with_bad_metadata(quiet: LadderSettings) -> None:
    events = [
        {"event_id": "ok", "user_id": "u-2", "region": "eu", "value": 7, "metadata": RICH},
        {"event_id": "big", "user_id": "u-3", "region": "eu", "value": 8},
        {"event_id": "list", "user_id": "u-4", "region": "eu", "value": 9, "metadata": [1]},
    ]
    events[1]["metadata"] = sized(LIMIT + 1, "é")
    async with api_client(quiet) as client:
        await make_board(client, "set", "set", None)
        response = await client.post(
            "/v1/boards/set/scores/batch", json={"events": events}, headers=SERVER
        )
        page = await read(client, "/v1/boards/set/leaderboard", scope="region:eu")

    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r.get("error", {}).get("status", 200) for r in results] == [200, 422, 422]
    assert [(e["user_id"], canon(e["metadata"])) for e in page["entries"]] == [("u-2", canon(RICH))]


def nested(levels: int) -> dict[str, Any]:
    """An object holding arrays in arrays, ``levels`` levels of them with the object."""
    inner: Any = 1
    for _ in range(levels - 1):
        inner = [inner]
    return {"a": inner}


async def test_metadata_nested_past_32_levels_is_refused_in_a_post_and_in_a_batch(
    quiet: LadderSettings, redis: Redis
) -> None:
    # Deeper metadata made a broker message unreadable to the consumers (whose parser stops near
    # 200 levels: the message's events were dead-lettered, other users' too), or, past orjson's
    # 254 with the body hash's level, a batch's 500.
    body = {"user_id": "u-1", "region": "eu", "value": 2}
    deep = [
        {"event_id": f"d{n}", "user_id": f"u-{n}", "region": "eu", "value": 3} | {"metadata": m}
        for n, m in ((33, nested(33)), (197, nested(197)), (253, nested(253)))
    ]
    async with api_client(quiet) as client:
        await make_board(client, "set", "set", None)
        await write(client, "set", None, "u-1", 1, moment(), {"keep": True})
        refused = await refused_changes_nothing(
            client, redis, quiet.key_prefix, body | {"metadata": nested(33)}
        )
        accepted = await client.post(
            "/v1/boards/set/scores", json=body | {"metadata": nested(32)}, headers=SERVER
        )
        batch = await client.post(
            "/v1/boards/set/scores/batch",
            json={"events": [*deep, {"user_id": "u-2", "region": "eu", "value": 4}]},
            headers=SERVER,
        )

    problem = assert_problem(refused, 422)
    assert any("32 levels" in e["msg"] for e in problem["errors"]), problem
    assert accepted.status_code == 200, accepted.text
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert [r.get("error", {}).get("status", 200) for r in results] == [422, 422, 422, 200]


@pytest.mark.parametrize(
    ("operator", "late_value", "kept_metadata"),
    [
        pytest.param("set", 9, {"a": 1}, id="set-leaves-it"),
        pytest.param("incr", 9, {"a": 1}, id="incr-leaves-it"),
        pytest.param("best", 5, {"a": 2}, id="best-equal-brings-its-own"),
    ],
)
async def test_a_late_write_keeps_the_metadata_of_when_it_happened(
    quiet: LadderSettings, operator: str, late_value: int, kept_metadata: dict[str, Any]
) -> None:
    """A write that happened before the entry's score was reached (it came late) leaves the
    metadata of the later event on set and incr boards; on best, an equal late write reached the
    best first, so the best is its."""
    start = moment()
    async with api_client(quiet) as client:
        await make_board(client, operator, operator, None)
        await write(client, operator, None, "u-1", 5, start + timedelta(seconds=1), {"a": 1})
        await write(client, operator, None, "u-1", late_value, start, {"a": 2})
        assert await held(client, operator) == kept_metadata


@pytest.mark.parametrize("sub_order", [None, "asc"])
async def test_a_set_late_to_a_later_write_of_the_same_score_keeps_that_writes_metadata(
    quiet: LadderSettings, redis: Redis, keys: Keys, sub_order: str | None
) -> None:
    """A set board's entry set again to the score it holds (reached first before) takes that
    later write's metadata, and a write that happened between the two is late: the score and
    the metadata stay the later write's, in the region and in global, on every period."""
    start = moment()
    async with api_client(quiet) as client:
        await make_board(client, "set", "set", sub_order)
        await write(client, "set", sub_order, "u-1", 5, start, {"a": 1})
        await write(client, "set", sub_order, "u-1", 5, start + timedelta(seconds=2), {"a": 2})
        late = await write(
            client, "set", sub_order, "u-1", 9, start + timedelta(seconds=1), {"a": 3}
        )
        await merge_board(redis, keys, "set")
        final = [
            await held(client, "set", scope, period=period)
            for period in PERIODS
            for scope in ("region:eu", "global")
        ]

    assert {(p["score"], p["improved"]) for p in late["periods"].values()} == {(5, False)}
    assert final == [{"a": 2}] * len(final)
