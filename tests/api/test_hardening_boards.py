"""Hostile use, round two, of boards and credentials (docs/security.md): declared regions and
player teams, reads whose cost does not follow what writers invent, the bounded board catalog,
and the insecure defaults (prod keys, the image's environment, the credential before the body
and before the board).

Every test runs against real Redis and MySQL; the API runs in-process (its lifespan and all),
or as a process of its own where its start-up is what is tested.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
import uuid
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from redis.asyncio import Redis

from services.aggregator.derive import Derive
from services.aggregator.handlers import MarkDirty, aggregate
from services.aggregator.live_tracker import RecordLive
from services.api.app import create_app
from shared.boards import BOARD_CACHE_SIZE, MAX_REGIONS, Board, BoardCatalog
from shared.events import ScoreAccepted
from shared.keys import Keys, regions_of
from shared.live_maths import MVP_TEAMS
from shared.settings import MIN_SECRET_BYTES, LadderSettings
from tests.api.helpers import add_board, assert_problem, score
from tests.helpers import (
    ADMIN,
    SERVER,
    UNREACHABLE_BROKER,
    api_client,
    derive_outbox,
    dockerfile_instructions,
    player,
    snapshot,
)
from tests.stack import ROOT, free_port, redis_env, run, spawn_api

pytestmark = pytest.mark.usefixtures("mysql_database")

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


async def tag_keys(redis: Redis, keys: Keys, board_id: str) -> set[str]:
    """Every key of the board's hash tag, rate-limit buckets included."""
    return {k async for k in redis.scan_iter(match=keys.tag(board_id) + "*", count=1000)}


async def put_board(client: httpx.AsyncClient, board_id: str, body: dict[str, Any]) -> Any:
    return await client.put(f"/v1/boards/{board_id}", json=body, headers=ADMIN)


async def outbox(redis: Redis, keys: Keys, board_id: str) -> list[ScoreAccepted]:
    entries: list[Any] = await redis.xrange(keys.outbox(board_id))
    return [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]


# --- 1. declared regions, no player teams ---------------------------------------------------


async def test_a_player_writes_board_must_declare_its_regions(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        undeclared = await put_board(client, "open", {"player_writes": True})
        empty = await put_board(client, "open", {"player_writes": True, "regions": []})
        twice = await put_board(client, "open", {"player_writes": True, "regions": ["eu", "eu"]})
        too_many = await put_board(
            client,
            "open",
            {"player_writes": True, "regions": [f"r{i}" for i in range(MAX_REGIONS + 1)]},
        )
        after = await client.get("/v1/boards/open")
        declared = await put_board(client, "open", {"player_writes": True, "regions": ["eu"]})
        servers_only = await put_board(client, "servers", {})

    for refused in (undeclared, empty, twice, too_many):
        assert_problem(refused, 422)
    assert "must declare its regions" in undeclared.text
    assert_problem(after, 404)  # a refused definition stored nothing
    assert declared.status_code == 201, declared.text
    assert declared.json()["regions"] == ["eu"]
    assert servers_only.json()["regions"] is None


async def test_an_undeclared_region_gets_422_and_a_player_team_403_creating_no_key(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        created = await put_board(client, "open", {"player_writes": True, "regions": ["eu", "na"]})
        assert created.status_code == 201, created.text
        before_tag = await tag_keys(redis, keys, "open")
        before = await snapshot(redis, quiet.key_prefix)
        refusals = [
            (
                await client.post(
                    "/v1/boards/open/scores",
                    json=score(user_id="u-1", region="xx"),
                    headers=player("u-1"),
                ),
                422,
            ),
            (
                await client.post(
                    "/v1/boards/open/scores", json=score(region="xx"), headers=SERVER
                ),
                422,
            ),
            (
                await client.post(
                    "/v1/boards/open/scores",
                    json=score(user_id="u-1", team_id="red"),
                    headers=player("u-1"),
                ),
                403,
            ),
        ]
        after_tag = await tag_keys(redis, keys, "open")
        after = await snapshot(redis, quiet.key_prefix)
        # The same write in a declared region and without a team is taken: the count above
        # would have seen its keys.
        accepted = await client.post(
            "/v1/boards/open/scores", json=score(user_id="u-1", region="na"), headers=player("u-1")
        )
        server_team = await client.post(
            "/v1/boards/open/scores", json=score(user_id="u-2", team_id="red"), headers=SERVER
        )
        written = await tag_keys(redis, keys, "open")

    for response, status in refusals:
        body = assert_problem(response, status)
        if status == 422:
            assert body["errors"][0]["loc"] == ["body", "region"], body
    assert after_tag == before_tag
    assert after == before
    assert accepted.status_code == 200, accepted.text
    assert server_team.status_code == 200, server_team.text
    assert len(written) > len(before_tag)
    print(f"refused writes left {len(after_tag)} keys of the tag; accepted ones made {written}")


async def test_a_read_of_an_undeclared_region_gets_422_unless_its_view_is_kept(
    quiet: LadderSettings,
) -> None:
    """A region scope the board does not declare, and of which it keeps no view, is refused as
    a write naming it is: it read as an empty board (200, total 0), which hid a client's typo.
    A region the declaration left out stays readable while its view is kept."""
    async with api_client(quiet) as client:
        await put_board(client, "open", {"regions": ["eu", "na", "sa"]})
        await client.post("/v1/boards/open/scores", json=score(region="eu"), headers=SERVER)
        await client.post("/v1/boards/open/scores", json=score(region="sa"), headers=SERVER)
        await put_board(client, "open", {"regions": ["eu", "na"]})
        refused = [
            await client.get("/v1/boards/open/leaderboard", params={"scope": "region:as"}),
            await client.get("/v1/boards/open/users/u-1", params={"scope": "region:as"}),
        ]
        declared = await client.get("/v1/boards/open/leaderboard", params={"scope": "region:eu"})
        left_out = await client.get("/v1/boards/open/leaderboard", params={"scope": "region:sa"})
    for response in refused:
        body = assert_problem(response, 422)
        assert body["errors"][0]["loc"] == ["query", "scope"], body
        assert "declares no region 'as' and keeps no view of it" in body["detail"], body
        assert "its regions are eu, na" in body["detail"], body
    assert declared.status_code == 200, declared.text
    assert [e["user_id"] for e in declared.json()["entries"]] == ["u-1"]
    assert left_out.status_code == 200, left_out.text
    assert [e["user_id"] for e in left_out.json()["entries"]] == ["u-1"]


async def test_a_batch_judges_each_event_s_region_on_its_own(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    events = [
        score(event_id="b-1", user_id="u-1", region="eu"),
        score(event_id="b-2", user_id="u-2", region="xx"),
        score(event_id="b-3", user_id="u-3", region="na"),
    ]
    async with api_client(quiet) as client:
        await put_board(client, "decl", {"regions": ["eu", "na"]})
        response = await client.post(
            "/v1/boards/decl/scores/batch", json={"events": events}, headers=SERVER
        )

    assert response.status_code == 200, response.text
    first, refused, third = response.json()["results"]
    assert first["region"] == "eu" and not first["duplicate"]
    assert third["region"] == "na"
    assert refused["event_id"] == "b-2"
    assert refused["error"]["status"] == 422
    assert refused["error"]["errors"][0]["loc"] == ["body", "events", 1, "region"]
    written = [e.event_id for e in await outbox(redis, keys, "decl")]
    assert written == ["b-1", "b-3"]
    assert not await redis.exists(keys.region_view("decl", "alltime", "all", "xx"))


async def test_a_stored_player_board_without_regions_stays_readable_and_refuses_players(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A definition stored before regions could be declared: it loads, it is served, its
    server writes go on, and players are refused until an admin declares its regions."""
    await add_board(redis, keys, Board(board_id="legacy", player_writes=True))
    async with api_client(quiet) as client:
        read = await client.get("/v1/boards/legacy")
        by_player = await client.post(
            "/v1/boards/legacy/scores", json=score(user_id="u-1"), headers=player("u-1")
        )
        by_server = await client.post("/v1/boards/legacy/scores", json=score(), headers=SERVER)
        declared = await put_board(client, "legacy", {"player_writes": True, "regions": ["eu"]})
        later = await client.post(
            "/v1/boards/legacy/scores", json=score(user_id="u-1"), headers=player("u-1")
        )

    assert read.status_code == 200, read.text
    assert (read.json()["player_writes"], read.json()["regions"]) == (True, None)
    assert "once it declares its regions" in assert_problem(by_player, 403)["detail"]
    assert by_server.status_code == 200, by_server.text
    assert declared.status_code == 200, declared.text
    assert later.status_code == 200, later.text


async def test_ranks_walk_only_declared_regions(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A region written before the declaration narrowed keeps its keys, but a ranks read no
    longer walks it, and no new event may name it."""
    async with api_client(quiet) as client:
        await put_board(client, "decl", {"regions": ["eu", "na", "xx"]})
        for region in ("eu", "xx"):
            response = await client.post(
                "/v1/boards/decl/scores", json=score(region=region), headers=SERVER
            )
            assert response.status_code == 200, response.text
        board = Board(board_id="decl", regions=("eu", "na", "xx"))
        await derive_outbox(redis, keys, board, quiet.feed_length)
        wide = await client.get("/v1/boards/decl/users/u-1/ranks")
        narrowed = await put_board(client, "decl", {"regions": ["eu", "na"]})
        narrow = await client.get("/v1/boards/decl/users/u-1/ranks")
        refused = await client.post(
            "/v1/boards/decl/scores", json=score(region="xx"), headers=SERVER
        )

    assert narrowed.status_code == 200, narrowed.text
    scopes = wide.json()["periods"]["alltime"]["scopes"]
    assert {"region:eu", "region:xx"} <= scopes.keys()
    scopes = narrow.json()["periods"]["alltime"]["scopes"]
    assert "region:eu" in scopes and "region:xx" not in scopes
    assert "xx" in regions_of(await redis.hget(keys.user_regions("decl"), "u-1"))
    assert_problem(refused, 422)


async def test_ranks_of_a_user_whose_only_region_is_no_longer_declared(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Its scores stay readable (docs/api.md section 3): no regional scope, but its global one,
    not a 404 as for a user who never scored; and as_of is there, null before any merge."""
    async with api_client(quiet) as client:
        await put_board(client, "gone", {"regions": ["eu", "xx"]})
        response = await client.post(
            "/v1/boards/gone/scores", json=score(region="xx"), headers=SERVER
        )
        assert response.status_code == 200, response.text
        board = Board(board_id="gone", regions=("eu", "xx"))
        await derive_outbox(redis, keys, board, quiet.feed_length)
        await redis.hdel(keys.as_of("gone"), "derived")  # as before the aggregator's first
        await put_board(client, "gone", {"regions": ["eu"]})
        ranks = await client.get("/v1/boards/gone/users/u-1/ranks")
    assert ranks.status_code == 200, ranks.text
    body = ranks.json()
    assert body["as_of"] is None
    assert all(not p["scopes"] or "region:xx" not in p["scopes"] for p in body["periods"].values())


async def test_ranks_walk_at_most_max_regions_of_a_board_without_declared_regions(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """On a board without declared regions (server keys alone write there), a user in more
    regions than MAX_REGIONS is read in MAX_REGIONS of them: the read's cost has a bound."""
    regions = [f"r{i:03d}" for i in range(MAX_REGIONS + 6)]
    events = [score(region=r, value=1) for r in regions]
    generous = quiet.model_copy(update={"user_rate": 10_000.0})
    async with api_client(generous) as client:
        await put_board(client, "wide", {"periods": ["alltime"]})
        response = await client.post(
            "/v1/boards/wide/scores/batch", json={"events": events}, headers=SERVER
        )
        assert response.status_code == 200, response.text
        assert all("error" not in r for r in response.json()["results"]), response.text
        await derive_outbox(
            redis, keys, Board(board_id="wide", periods=("alltime",)), quiet.feed_length
        )
        ranks = await client.get("/v1/boards/wide/users/u-1/ranks")

    assert len(regions_of(await redis.hget(keys.user_regions("wide"), "u-1"))) == len(regions)
    assert ranks.status_code == 200, ranks.text
    scopes = ranks.json()["periods"]["alltime"]["scopes"]
    shown = [s for s in scopes if s.startswith("region:")]
    assert len(shown) == MAX_REGIONS
    assert set(shown) <= {f"region:{r}" for r in regions}


@pytest.mark.parametrize("declared", [("eu", "na"), None])
async def test_ranks_read_a_users_regions_from_its_set_of_the_layout_before(
    quiet: LadderSettings, redis: Redis, keys: Keys, declared: tuple[str, ...] | None
) -> None:
    """A user derived before the board's users' regions hash kept its regions in a set of its
    own: a ranks read walks them (bounded as the hash's are) until the derive step takes the set
    into the hash."""
    definition = {"regions": list(declared)} if declared else {}
    async with api_client(quiet) as client:
        await put_board(client, "old", definition)
        for region in ("eu", "na"):
            response = await client.post(
                "/v1/boards/old/scores", json=score(region=region), headers=SERVER
            )
            assert response.status_code == 200, response.text
        board = Board(board_id="old", regions=declared)
        await derive_outbox(redis, keys, board, quiet.feed_length)
        assert await redis.hget(keys.user_regions("old"), "u-1") == "eu na"
        await redis.hdel(keys.user_regions("old"), "u-1")
        await redis.sadd(keys.legacy_user_regions("old", "u-1"), "eu", "na")
        ranks = await client.get("/v1/boards/old/users/u-1/ranks")

    assert ranks.status_code == 200, ranks.text
    scopes = ranks.json()["periods"]["alltime"]["scopes"]
    assert {"region:eu", "region:na"} <= scopes.keys()


async def test_mvps_read_a_bounded_number_of_teams(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """MVP_TEAMS teams of two members each (a share of a half) and one more team of a single
    member with the smallest total (a share of one, which would lead an unbounded read): the
    read takes the MVP_TEAMS largest teams only, so the single member is not among the MVPs."""
    events: list[dict[str, Any]] = []
    for i in range(MVP_TEAMS):
        for member in ("a", "b"):
            events.append(score(user_id=f"u-{i}-{member}", team_id=f"t{i:04d}", value=100 + i))
    events.append(score(user_id="u-tiny", team_id="tiny", value=1))
    catalog = BoardCatalog(redis, keys)
    handler = aggregate(
        Derive(redis, keys, catalog, quiet.feed_length),
        MarkDirty(redis, keys),
        RecordLive(redis, keys, catalog),
    )
    async with api_client(quiet) as client:
        await put_board(client, "clans", {"periods": ["alltime"]})
        for start in range(0, len(events), 1000):
            response = await client.post(
                "/v1/boards/clans/scores/batch",
                json={"events": events[start : start + 1000]},
                headers=SERVER,
            )
            assert response.status_code == 200, response.text
        await handler(await outbox(redis, keys, "clans"))
        teams = await redis.zcard(keys.teams_view("clans", "alltime", "all"))
        started = time.perf_counter()
        mvps = await client.get("/v1/boards/clans/mvps")
        elapsed = time.perf_counter() - started

    assert teams == MVP_TEAMS + 1
    assert mvps.status_code == 200, mvps.text
    entries = mvps.json()["entries"]
    assert len(entries) == 10
    assert "u-tiny" not in {e["user_id"] for e in entries}
    assert {e["share"] for e in entries} == {0.5}
    # The largest teams first among equal shares: the larger user_score.
    assert entries[0]["team_id"] == f"t{MVP_TEAMS - 1:04d}"
    print(f"mvps over {teams} teams (read {MVP_TEAMS}) in {elapsed * 1000:.1f} ms")


# --- 3. the board catalog's cache is bounded ------------------------------------------------


async def test_a_flood_of_unknown_board_ids_leaves_the_catalog_empty(
    redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys, maxsize=100)
    await catalog.ensure_defaults()
    assert await catalog.get("main") is not None
    for i in range(2_000):
        assert await catalog.get(f"nope-{uuid.uuid4().hex[:12]}-{i}") is None
    assert catalog.cached == 1  # main: a miss is not remembered


async def test_the_catalog_keeps_at_most_maxsize_boards(redis: Redis, keys: Keys) -> None:
    catalog = BoardCatalog(redis, keys, maxsize=100)
    for i in range(150):
        await add_board(redis, keys, Board(board_id=f"b{i:03d}"))
        assert await catalog.get(f"b{i:03d}") is not None
        assert catalog.cached <= 100
    assert catalog.cached == catalog.maxsize == 100


async def test_a_board_created_elsewhere_is_seen_at_once_and_a_change_after_the_ttl(
    redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys, ttl=0.3)
    assert await catalog.get("later") is None
    # Stored behind the catalog's back (another process's PUT): the miss was not kept.
    await add_board(redis, keys, Board(board_id="later", operator="best"))
    found = await catalog.get("later")
    assert found is not None and found.operator == "best"
    # A change is seen once the cached copy ages out, or at once when asked fresh.
    await add_board(redis, keys, Board(board_id="later", operator="set"))
    cached = await catalog.get("later")
    assert cached is not None and cached.operator == "best"
    fresh = await catalog.get("later", fresh=True)
    assert fresh is not None and fresh.operator == "set"
    await redis.hdel(keys.boards, "later")
    await asyncio.sleep(0.4)
    assert catalog.cached == 0
    assert await catalog.get("later") is None


async def test_the_api_catalog_keeps_no_unknown_board_ids(
    quiet: LadderSettings,
) -> None:
    app = create_app(quiet)
    lifespan_state: dict[str, Any] = {}

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            lifespan_state.update(state=scope["state"])
        await app(scope, receive, send)

    async with LifespanManager(watched) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ladder") as client:
            for i in range(300):
                response = await client.get(f"/v1/boards/flood-{i}/leaderboard")
                assert_problem(response, 404)
        catalog = lifespan_state["state"]["ladder"].catalog
        # The app's own catalog remembers none of the ids that were asked for.
        assert catalog.cached <= 1  # main, if anything read it
        assert catalog.maxsize == BOARD_CACHE_SIZE


# --- 7. insecure defaults ------------------------------------------------------------------


def image_environment() -> dict[str, str]:
    """The variables the image's ENV instructions set (deploy/Dockerfile), as a container
    started from it without ``-e`` sees them."""
    env: dict[str, str] = {}
    for keyword, arguments in dockerfile_instructions(DOCKERFILE):
        if keyword == "ENV":
            for assignment in shlex.split(arguments):
                name, _, value = assignment.partition("=")
                env[name] = value
    return env


def test_the_image_defaults_to_prod() -> None:
    assert image_environment().get("LADDER_ENV") == "prod"


def container_env(**ladder: str) -> dict[str, str]:
    """This machine's environment without any LADDER_ setting, the image's on top, then
    ``ladder``: what a service in a container of the image sees."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
    env.update(image_environment())
    env.update(ladder)
    return env


LONG = {
    "LADDER_SERVER_KEYS": "s" * MIN_SECRET_BYTES,
    "LADDER_ADMIN_KEYS": "a" * MIN_SECRET_BYTES,
    "LADDER_JWT_SECRET": "j" * MIN_SECRET_BYTES,
}


@pytest.mark.parametrize(
    ("variable", "short", "said"),
    [
        (
            "LADDER_SERVER_KEYS",
            "s" * MIN_SECRET_BYTES + ",one-byte-short-" + "x" * 16,
            "LADDER_SERVER_KEYS: key 2 of 2 is shorter than 32 bytes",
        ),
        (
            "LADDER_ADMIN_KEYS",
            "short-admin-key",
            "LADDER_ADMIN_KEYS: key 1 of 1 is shorter than 32 bytes",
        ),
        ("LADDER_JWT_SECRET", "j" * 31, "LADDER_JWT_SECRET is shorter than 32 bytes"),
    ],
)
def test_the_image_refuses_to_start_with_a_short_key(variable: str, short: str, said: str) -> None:
    done = run(
        [sys.executable, "-m", "services.api"], env=container_env(**(LONG | {variable: short}))
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    # The error names the key by its position, never by its value.
    for key in short.split(","):
        assert key not in done.stderr


async def test_the_image_starts_with_keys_of_32_bytes(settings: LadderSettings) -> None:
    port = free_port()
    env = container_env(
        **LONG,
        LADDER_KEY_PREFIX=settings.key_prefix,
        LADDER_BROKER_PREFIX=settings.broker_prefix,
        **redis_env(settings),
        LADDER_AMQP_URL=UNREACHABLE_BROKER,
        LADDER_MYSQL_URL=settings.mysql_url,
        LADDER_API_PORT=str(port),
        LADDER_API_WORKERS="1",
        LADDER_LOG_LEVEL="WARNING",
    )
    process = spawn_api(env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            end = time.monotonic() + 60
            ready = None
            while time.monotonic() < end and ready is None:
                assert process.poll() is None, "the API exited"
                try:
                    ready = await client.get(f"{url}/healthz")
                except httpx.TransportError:
                    await asyncio.sleep(0.2)
            assert ready is not None and ready.status_code == 200
            key = {"Authorization": f"Bearer {LONG['LADDER_SERVER_KEYS']}"}
            posted = await client.post(f"{url}/v1/boards/main/scores", json=score(), headers=key)
            dev = await client.post(f"{url}/v1/boards/main/scores", json=score(), headers=SERVER)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert posted.status_code == 200, posted.text
    assert_problem(dev, 401)  # prod has no development key


def test_prod_settings_refuse_short_keys_and_take_long_ones() -> None:
    def prod(**keys: Any) -> LadderSettings:
        return LadderSettings(_env_file=None, env="prod", **keys)  # type: ignore[call-arg]

    long = {"server_keys": ["s" * 32], "admin_keys": ["a" * 32], "jwt_secret": "j" * 32}
    assert prod(**long).effective_server_keys == {"s" * 32}
    for field, value in (
        ("server_keys", ["s" * 32, "s" * 31]),
        ("admin_keys", ["a" * 31]),
        ("jwt_secret", "j" * 31),
        ("jwt_secret", "é" * 15),  # 30 bytes in UTF-8: bytes count, not characters
    ):
        with pytest.raises(ValueError, match="shorter than 32 bytes"):
            prod(**(long | {field: value}))
    # Dev keeps its short development defaults.
    dev = LadderSettings(_env_file=None, env="dev")  # type: ignore[call-arg]
    assert dev.uses_dev_defaults == ["server key", "admin key", "JWT secret"]


BAD_BODIES = [
    pytest.param(b"{", id="not-json"),
    pytest.param(b'{"user_id": 7, "value": "many"}', id="invalid"),
    pytest.param(b"", id="empty"),
]


@pytest.mark.parametrize("content", BAD_BODIES)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/boards/main/scores"),
        ("POST", "/v1/boards/main/scores/batch"),
        ("PUT", "/v1/boards/new-board"),
        ("POST", "/v1/boards/no-such-board/scores"),
        ("PUT", "/v1/users/u-1/friends/u-2"),
    ],
)
async def test_an_anonymous_write_with_a_bad_body_gets_401(
    quiet: LadderSettings, redis: Redis, method: str, path: str, content: bytes
) -> None:
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        response = await client.request(method, path, content=content)
        after = await snapshot(redis, quiet.key_prefix)
    assert_problem(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"
    assert after == before


@pytest.mark.parametrize("content", BAD_BODIES)
async def test_a_bad_credential_with_a_bad_body_gets_401_on_the_score_post(
    quiet: LadderSettings, content: bytes
) -> None:
    async with api_client(quiet) as client:
        bad = await client.post(
            "/v1/boards/main/scores", content=content, headers={"Authorization": "Bearer nope"}
        )
        invalid_on_batch = await client.post(
            "/v1/boards/main/scores/batch",
            json={"events": "not a list"},
            headers={"Authorization": "Bearer nope"},
        )
        # With a good credential the body is judged as before.
        judged = await client.post("/v1/boards/main/scores", content=content, headers=SERVER)
    assert_problem(bad, 401)
    assert_problem(invalid_on_batch, 401)
    assert judged.status_code in (400, 422), judged.text


async def test_while_reads_are_private_unknown_boards_answer_401_or_403_before_404(
    quiet: LadderSettings,
) -> None:
    private = quiet.model_copy(update={"public_reads": False})
    reads = [
        "/v1/boards/nope",
        "/v1/boards/nope/leaderboard",
        "/v1/boards/nope/users/u-1?scope=global",
        "/v1/boards/nope/users/u-1/ranks",
        "/v1/boards/nope/users/u-1/events",
        "/v1/boards/nope/feed",
        "/v1/boards/nope/stats",
        "/v1/boards/nope/hot",
        "/v1/boards/nope/mvps",
        "/v1/boards/nope/snapshots?scope=global",
        "/v1/boards/nope/users/u-1/badges",
        "/v1/boards/Not_A_Board/leaderboard",
    ]
    async with api_client(private) as client:
        anonymous = {path: await client.get(path) for path in reads}
        bad = {
            path: await client.get(path, headers={"Authorization": "Bearer nope"}) for path in reads
        }
        known = await client.get("/v1/boards/main/leaderboard")
        # An authenticated caller may learn that a board does not exist...
        as_player = await client.get("/v1/boards/nope/leaderboard", headers=player("u-1"))
        # ...unless what it asks is not its to ask: then 403 first.
        others_events = await client.get("/v1/boards/nope/users/u-2/events", headers=player("u-1"))
        player_batch = await client.post(
            "/v1/boards/nope/scores/batch",
            json={"events": [score()]},
            headers=player("u-1"),
        )

    for path in reads:
        assert_problem(anonymous[path], 401)
        assert_problem(bad[path], 401)
    assert_problem(known, 401)
    assert_problem(as_player, 404)
    assert_problem(others_events, 403)
    assert_problem(player_batch, 403)


async def test_public_reads_still_answer_anonymous_reads_and_404_for_unknown_boards(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        known = await client.get("/v1/boards/main/leaderboard")
        unknown = await client.get("/v1/boards/nope/leaderboard")
        bad_credential = await client.get(
            "/v1/boards/nope/leaderboard", headers={"Authorization": "Bearer nope"}
        )
        health = await client.get("/healthz")
    assert known.status_code == 200, known.text
    assert_problem(unknown, 404)
    assert_problem(bad_credential, 401)
    assert health.status_code == 200


async def test_ranks_take_one_period_id_of_each_of_five_kinds(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    # A board with a schedule keeps five kinds of period: a past id of each may be asked for.
    async with api_client(quiet) as client:
        await put_board(client, "five", {"schedule": "0 0 * * 1"})
        response = await client.post("/v1/boards/five/scores", json=score(), headers=SERVER)
        assert response.status_code == 200, response.text
        periods = response.json()["periods"]
        ids = [periods[p]["period_id"] for p in ("daily", "weekly", "monthly", "alltime", "season")]
        board = Board(board_id="five", schedule="0 0 * * 1")
        await derive_outbox(redis, keys, board, quiet.feed_length)  # the user's regions
        ranks = await client.get("/v1/boards/five/users/u-1/ranks", params={"period_id": ids})
    assert ranks.status_code == 200, ranks.text
    assert {p: v["period_id"] for p, v in ranks.json()["periods"].items()} == dict(
        zip(("daily", "weekly", "monthly", "alltime", "season"), ids, strict=True)
    )
