"""A query string is checked as strictly as a body (docs/api.md section 1): a parameter the
route does not declare, and a second value of one that takes a single value, are a 422 naming
them, after the credential and the board are judged, and change nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Optional

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Query
from fastapi.routing import APIRoute, iter_route_contexts
from redis.asyncio import Redis
from starlette.datastructures import QueryParams

from services.api import errors
from services.api.app import create_app
from services.api.routes.params import DirectRoute
from services.api.strict_query import (
    Declared,
    StrictQueryRoute,
    declared_of,
    errors_of,
    takes_several,
)
from shared.boards import Board
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import (
    LEADERBOARD,
    SCORES,
    add_board,
    assert_problem,
    period_ids,
    score,
)
from tests.helpers import ADMIN, SERVER, api_client, snapshot

BATCH = "/v1/boards/main/scores/batch"
HIDE = "/v1/boards/main/users/u-1/hidden"
NEW_BOARD = "/v1/boards/fresh"
BOARD = {"operator": "best", "order": "desc", "periods": ["alltime"]}


def _named(response: httpx.Response, *expected: tuple[str, str]) -> None:
    """A 422 whose errors name each ``(parameter, type)`` of ``expected`` in the query."""
    body = assert_problem(response, 422)
    found = {(tuple(e["loc"]), e["type"]) for e in body["errors"]}
    for name, kind in expected:
        assert (("query", name), kind) in found, body


# (method, path, JSON body, credential, unknown query, repeated query, the error it gets)
REPEATED = "repeated_parameter"
UNKNOWN = "extra_forbidden"  # a parameter the route does not declare, given twice: unknown
CASES: list[tuple[str, str, Any, dict[str, str], str, str, str]] = [
    ("GET", LEADERBOARD, None, SERVER, "limt=5", "limit=5&limit=50", REPEATED),
    ("GET", "/v1/boards/main/feed", None, SERVER, "perod=weekly", "limit=5&limit=6", REPEATED),
    ("POST", SCORES, score(), SERVER, "dry_run=1", "dry_run=1&dry_run=2", UNKNOWN),
    ("POST", BATCH, {"events": [score()]}, SERVER, "dry_run=1", "dry_run=1&dry_run=2", UNKNOWN),
    ("PUT", HIDE, None, ADMIN, "purge=true", "purge=true&purge=true", UNKNOWN),
    ("PUT", NEW_BOARD, BOARD, ADMIN, "purge=true", "purge=1&purge=1", UNKNOWN),
    ("DELETE", "/v1/boards/gone", None, ADMIN, "purg=true", "purge=true&purge=false", REPEATED),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "credential", "unknown", "repeated", "kind"), CASES
)
async def test_an_unknown_or_repeated_query_parameter_is_a_422_naming_it_and_changes_nothing(
    quiet: LadderSettings,
    redis: Redis,
    method: str,
    path: str,
    body: Any,
    credential: dict[str, str],
    unknown: str,
    repeated: str,
    kind: str,
) -> None:
    # The board deleted: one that exists, as the deletion judges its board before its query.
    await add_board(redis, Keys(quiet.key_prefix), Board(board_id="gone"))
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        sent = {"json": body} if body is not None else {}
        response = await client.request(method, f"{path}?{unknown}", headers=credential, **sent)
        _named(response, (unknown.partition("=")[0], UNKNOWN))
        assert response.json()["errors"][0]["msg"] == "Extra inputs are not permitted"
        response = await client.request(method, f"{path}?{repeated}", headers=credential, **sent)
        _named(response, (repeated.partition("=")[0], kind))
        assert len(response.json()["errors"]) == 1  # named once, however often it is given
        assert await snapshot(redis, quiet.key_prefix) == before


async def test_the_reads_answer_with_one_value_of_each_declared_parameter(
    quiet: LadderSettings, redis: Redis
) -> None:
    async with api_client(quiet) as client:
        for _ in range(2):  # the second from the reads' cache of checked queries
            response = await client.get(f"{LEADERBOARD}?limit=5&rank_style=dense", headers=SERVER)
            assert response.status_code == 200, response.text
            _named(
                await client.get(f"{LEADERBOARD}?limit=5&limit=5", headers=SERVER),
                ("limit", "repeated_parameter"),
            )
        response = await client.get("/v1/boards/main/users/u-1?around=1&aroud=2", headers=SERVER)
        _named(response, ("aroud", "extra_forbidden"))
        response = await client.get("/healthz?verbose=1")
        _named(response, ("verbose", "extra_forbidden"))
        # The ranks read's period_id is a list: several values, one of each kind (its answers:
        # tests/api/test_reads.py, test_the_ranks_call_answers_every_period_and_scope).
        ids = period_ids(datetime.now(UTC))
        ranks = f"/v1/boards/main/users/u-1/ranks?period_id={ids['daily']}"
        one = await client.get(ranks, headers=SERVER)
        two = await client.get(f"{ranks}&period_id={ids['weekly']}", headers=SERVER)
        assert one.status_code == two.status_code != 422, two.text
        response = await client.get(f"{ranks}&rank_style=dense&rank_style=dense", headers=SERVER)
        _named(response, ("rank_style", REPEATED))


async def test_the_query_errors_come_with_the_others_after_the_credential_and_the_board(
    quiet: LadderSettings, redis: Redis
) -> None:
    async with api_client(quiet) as client:
        # The credential first, then the board.
        assert_problem(await client.post(f"{SCORES}?x=1", json=score()), 401)
        missing = "/v1/boards/nope/feed?limt=5"
        assert_problem(await client.get(missing, headers=SERVER), 404)
        assert_problem(await client.get("/v1/boards/nope/leaderboard?limt=5"), 404)
        # Then every error of the path, query and body in one 422.
        response = await client.get(f"{LEADERBOARD}?limit=0&limt=5", headers=SERVER)
        _named(response, ("limit", "greater_than_equal"), ("limt", "extra_forbidden"))
        response = await client.get("/v1/boards/main/feed?limit=0&limt=5", headers=SERVER)
        _named(response, ("limit", "greater_than_equal"), ("limt", "extra_forbidden"))
        response = await client.post(f"{BATCH}?x=1", json={"events": []}, headers=SERVER)
        body = assert_problem(response, 422)
        assert {tuple(e["loc"]) for e in body["errors"]} >= {("body", "events"), ("query", "x")}


def test_every_route_checks_the_query_parameters_its_document_lists(
    settings: LadderSettings,
) -> None:
    """Every REST route is checked (a solved route by its class, a direct one by its own code),
    against exactly the query parameters the OpenAPI document gives it."""
    app = create_app(settings)
    paths = app.openapi()["paths"]
    checked = 0
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        if context.path == "/":  # the dashboard page: its query is its script's (docs/dashboard.md)
            continue
        assert isinstance(route, StrictQueryRoute | DirectRoute), context.path
        for method in route.methods:
            operation = paths[context.path][method.lower()]
            query = [p for p in operation.get("parameters", ()) if p["in"] == "query"]
            declared = declared_of(route)
            assert declared.names == {p["name"] for p in query}, (method, context.path)
            lists = {p["name"] for p in query if _is_array(p["schema"])}
            assert declared.lists == lists, (method, context.path)
            checked += 1
    documented = [m for path, item in paths.items() if path != "/" for m in item]
    assert checked == len(documented)


def _is_array(schema: dict[str, Any]) -> bool:
    """Whether a parameter's schema in the OpenAPI document is an array, or null or one."""
    return schema.get("type") == "array" or any(_is_array(s) for s in schema.get("anyOf", ()))


@pytest.mark.parametrize(
    ("annotation", "several"),
    [
        (list[str], True),
        (list[str] | None, True),
        (Annotated[list[int] | None, Query()], True),
        (Optional[set[str]], True),  # noqa: UP045 - the older spelling, read the same
        (tuple[int, ...], True),
        (str, False),
        (bytes, False),
        (int | None, False),
        (Annotated[str, Query()], False),
    ],
)
def test_a_parameter_takes_several_values_where_its_type_is_a_collection(
    annotation: Any, several: bool
) -> None:
    assert takes_several(annotation) is several


def test_a_parameter_that_takes_a_list_takes_several_values() -> None:
    declared = Declared(frozenset({"id", "limit"}), frozenset({"id"}))
    assert errors_of(QueryParams("id=a&id=b&limit=3"), declared) == []
    errors = errors_of(QueryParams("id=a&limit=3&limit=3&lmit=1"), declared)
    assert [(e["loc"], e["type"]) for e in errors] == [
        (("query", "limit"), "repeated_parameter"),
        (("query", "lmit"), "extra_forbidden"),
    ]


async def test_a_route_of_its_own_takes_a_list_and_refuses_before_a_plain_endpoint_runs() -> None:
    """A list parameter takes several values; a plain (not async) endpoint is guarded too."""
    called: list[list[str]] = []
    router = APIRouter(route_class=StrictQueryRoute)

    @router.get("/tags")
    def tags(tag: Annotated[list[str], Query()], limit: int = 1) -> dict[str, Any]:
        called.append(tag)
        return {"tags": tag, "limit": limit}

    app = FastAPI()
    errors.install(app)
    app.include_router(router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/tags?tag=a&tag=b&limit=2")
        assert response.json() == {"tags": ["a", "b"], "limit": 2}
        _named(await client.get("/tags?tag=a&limit=2&limit=3"), ("limit", REPEATED))
        _named(await client.get("/tags?tag=a&tags=b"), ("tags", UNKNOWN))
        response = await client.get("/tags?limit=x&lmit=2")
        _named(response, ("tag", "missing"), ("limit", "int_parsing"), ("lmit", UNKNOWN))
    assert called == [["a", "b"]]
