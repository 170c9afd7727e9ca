"""The page and standing reads skip the routers' walk (services/api/routes/params.py,
``DirectPaths``), and a query string they have validated is not validated again (``query_of``):
neither changes an answer. Each request here is answered by the app as it runs, then by the same
app with its router walked and its query cache emptied; status, headers and body must agree."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from services.api.app import create_app
from services.api.direct_reads import DirectReads
from services.api.routes import params, reads
from services.api.routes.params import DirectPaths
from shared.settings import LadderSettings
from tests.api.helpers import post, score
from tests.helpers import SERVER, bearer, player

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

BOARD = "/v1/boards/main"
EU = {"scope": "region:eu"}

# (method, path, query, headers): answers of every kind the two reads give, and requests that
# look like theirs and belong to other routes or to none.
REQUESTS: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    ("GET", f"{BOARD}/leaderboard", EU, {}),
    ("GET", f"{BOARD}/leaderboard", {**EU, "limit": 2}, {}),
    ("GET", f"{BOARD}/leaderboard", {**EU, "rank_style": "competition"}, SERVER),
    ("GET", f"{BOARD}/leaderboard", {**EU, "rank_style": "dense", "period": "daily"}, {}),
    ("GET", f"{BOARD}/leaderboard", {"scope": "teams"}, {}),
    ("GET", f"{BOARD}/leaderboard", {"scope": "friends:u-1"}, player("u-1")),
    ("GET", f"{BOARD}/leaderboard", {"scope": "friends:u-1"}, {}),
    ("GET", f"{BOARD}/leaderboard", {"scope": "friends:u-1"}, player("u-2")),
    ("GET", f"{BOARD}/leaderboard", {**EU, "cursor": "nonsense"}, {}),
    ("GET", f"{BOARD}/leaderboard", {**EU, "limit": 0, "period": "hourly"}, {}),
    ("GET", f"{BOARD}/leaderboard", {**EU, "period": "season"}, {}),
    ("GET", f"{BOARD}/leaderboard", {**EU, "period_id": "2026-13-45", "period": "daily"}, {}),
    ("GET", f"{BOARD}/leaderboard", {**EU, "period_id": "1999-01-01", "period": "daily"}, {}),
    ("GET", f"{BOARD}/leaderboard", {"scope": "region:EU!"}, {}),
    ("GET", f"{BOARD}/leaderboard", EU, bearer("not-a-key")),
    ("GET", f"{BOARD}/leaderboard", EU, {"Authorization": "Basic abc"}),
    ("GET", f"{BOARD}/leaderboard?scope=global&scope=region:eu&unknown=1", {}, {}),
    ("GET", "/v1/boards/nope/leaderboard", EU, {}),
    ("GET", "/v1/boards/bad!id/leaderboard", EU, {}),
    ("GET", "/v1/boards/bad!id/leaderboard", {"limit": -1}, {}),
    ("GET", f"{BOARD}/users/u-1", EU, {}),
    ("GET", f"{BOARD}/users/u-2", {**EU, "around": 5, "rank_style": "dense"}, {}),
    ("GET", f"{BOARD}/users/u-3", {**EU, "around": 2, "rank_style": "competition"}, SERVER),
    ("GET", f"{BOARD}/users/u-1", {"scope": "friends:u-1", "around": 1}, player("u-1")),
    ("GET", f"{BOARD}/users/u-1", {"scope": "teams"}, {}),
    ("GET", f"{BOARD}/users/u-9", EU, {}),
    ("GET", f"{BOARD}/users/bad!user", EU, {}),
    ("GET", f"{BOARD}/users/bad!user", {"around": 99}, {}),
    ("GET", "/v1/boards/bad!id/users/bad!user", EU, {}),
    ("GET", "/v1/boards/nope/users/u-1", EU, {}),
    ("GET", f"{BOARD}/users/u-1", {"period": "weekly"}, {}),
    ("GET", f"{BOARD}/users/leaderboard", EU, {}),
    ("GET", f"{BOARD}/users/u-1/ranks", {}, {}),
    ("GET", f"{BOARD}/users/u-1/", EU, {}),
    ("GET", f"{BOARD}/leaderboard/", EU, {}),
    ("GET", f"{BOARD}/users/u%2F1", EU, {}),
    ("GET", f"{BOARD}/users", EU, {}),
    ("HEAD", f"{BOARD}/leaderboard", EU, {}),
    ("POST", f"{BOARD}/leaderboard", EU, SERVER),
    ("DELETE", f"{BOARD}/users/u-1", {}, SERVER),
    ("GET", f"{BOARD}/hot", {}, {}),
]


@contextlib.asynccontextmanager
async def serving(settings: LadderSettings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app of ``settings`` started, with a client of it."""
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://ladder") as client:
            yield app, client


@pytest.fixture
async def running(quiet: LadderSettings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with serving(quiet) as started:
        yield started


def _private(settings: LadderSettings) -> LadderSettings:
    return settings.model_copy(update={"public_reads": False})


def _answer(response: httpx.Response) -> tuple[int, dict[str, str], Any]:
    """Status, headers and body; a region's ``as_of`` is the time of the read, so it is left
    out (and the length with it)."""
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}
    if not response.content or "json" not in response.headers.get("content-type", ""):
        return response.status_code, headers, response.content
    body = response.json()
    if isinstance(body, dict):
        body.pop("as_of", None)
    return response.status_code, headers, body


async def test_the_direct_paths_answer_as_the_router_does(
    running: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, client = running
    shortcut = app.router.middleware_stack
    assert isinstance(shortcut, DirectPaths)
    for i, user in enumerate(("u-1", "u-2", "u-3", "u-4")):
        await post(client, score(user_id=user, value=10 * (i % 2), display_name=f"P{i}"))

    await _answer_alike(app, client, REQUESTS)


async def _answer_alike(
    app: FastAPI, client: httpx.AsyncClient, requests: list[tuple[str, str, Any, Any]]
) -> None:
    """Each request answered alike by the app as it runs and by the app without its shortcuts
    (DirectReads in front of the middleware, DirectPaths in the router's place)."""
    await client.get("/healthz")  # the middleware stack built
    shortcut, outer = app.router.middleware_stack, app.middleware_stack
    assert isinstance(shortcut, DirectPaths) and isinstance(outer, DirectReads)
    for method, path, query, headers in requests:
        request = client.build_request(method, path, params=query, headers=headers)
        direct = _answer(await client.send(request))
        app.router.middleware_stack, app.middleware_stack = shortcut.app, outer.app
        params._QUERIES.clear()
        try:
            routed = _answer(await client.send(request))
        finally:
            app.router.middleware_stack, app.middleware_stack = shortcut, outer
        assert direct == routed, (method, str(request.url), headers)


async def test_without_public_reads_the_direct_paths_answer_as_the_router_does(
    quiet: LadderSettings,
) -> None:
    async with serving(_private(quiet)) as (app, client):
        await post(client, score(value=10))
        await _answer_alike(
            app,
            client,
            [
                *REQUESTS,
                ("GET", f"{BOARD}/users/u-1", EU, player("u-2")),
                ("GET", f"{BOARD}/users/u-1", EU, {"Authorization": " "}),
            ],
        )


async def test_a_read_with_a_body_or_failing_unexpectedly_answers_as_the_router_does(
    running: tuple[FastAPI, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, client = running
    await post(client, score(user_id="u-1", value=10))
    body = {"Content-Length": "4"}
    big = {"Content-Length": str(10**9)}
    chunked = {"Transfer-Encoding": "chunked"}
    await _answer_alike(
        app,
        client,
        [
            ("GET", f"{BOARD}/users/u-1", EU, body),
            ("GET", f"{BOARD}/users/u-1", EU, big),
            ("GET", f"{BOARD}/leaderboard", EU, chunked),
        ],
    )

    async def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(reads.standings, "standing", broken)
    await _answer_alike(app, client, [("GET", f"{BOARD}/users/u-1", EU, {})])
    response = await client.get(f"{BOARD}/users/u-1", params=EU)
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"


async def test_without_public_reads_the_direct_paths_ask_for_a_credential(
    quiet: LadderSettings,
) -> None:
    async with serving(_private(quiet)) as (_, client):
        await post(client, score(value=10))
        anonymous = await client.get(f"{BOARD}/users/u-1", params=EU)
        served = await client.get(f"{BOARD}/users/u-1", params=EU, headers=player("u-2"))
    assert anonymous.status_code == 401
    assert served.status_code == 200
    assert served.json()["user_id"] == "u-1"


def test_the_direct_paths_take_only_plain_get_routes() -> None:
    from services.api.routes import reads, scores

    post_route = next(r for r in scores.router.routes if getattr(r, "name", "") == "post_score")
    with pytest.raises(ValueError, match="not a GET route"):
        DirectPaths(lambda *_: None, [post_route])  # type: ignore[list-item]
    assert {route.path for route in reads.DIRECT_READS} == {
        "/v1/boards/{board_id}/leaderboard",
        "/v1/boards/{board_id}/users/{user_id}",
    }
