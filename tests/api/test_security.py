"""Credentials everywhere, limits shared by every API process, and prod's refusal of dev secrets."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.boards import MAIN_BOARD
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.api.helpers import JSON
from tests.helpers import (
    ADMIN,
    SERVER,
    UNREACHABLE_BROKER,
    api_client,
    derive_outbox,
    player,
    stored_score,
)
from tests.stack import free_port, redis_env, run, spawn_api

pytestmark = pytest.mark.usefixtures("mysql_database")

CREDENTIALS: dict[str, dict[str, str]] = {
    "none": {},
    "bad": {"Authorization": "Bearer not-a-credential"},
    "self": player("u-1"),
    "other": player("u-2"),
    "server": SERVER,
    "admin": ADMIN,
}


def score(user: str = "u-1") -> dict[str, Any]:
    return {"user_id": user, "region": "eu", "value": 1}


# (name, method, path, body, {credential: status}); "{cred}" in a path is the credential's name.
OPEN_READ = {"none": 200, "bad": 401, "self": 200, "other": 200, "server": 200, "admin": 200}
OWN = {"none": 401, "bad": 401, "self": 200, "other": 403, "server": 200, "admin": 200}
OWN_204 = {k: (204 if v == 200 else v) for k, v in OWN.items()}
# A player's own PUT only asks (202); a key befriends at once (204).
ASKS = {**OWN_204, "self": 202}
SERVERS = {"none": 401, "bad": 401, "self": 403, "other": 403, "server": 200, "admin": 200}
ADMINS = {"none": 401, "bad": 401, "self": 403, "other": 403, "server": 403, "admin": 201}
MATRIX: list[tuple[str, str, str, Any, dict[str, int]]] = [
    ("score on main (no player writes)", "POST", "/v1/boards/main/scores", score(), SERVERS),
    ("score on a player-writes board", "POST", "/v1/boards/open/scores", score(), OWN),
    ("someone else's score", "POST", "/v1/boards/open/scores", score("u-9"), SERVERS),
    ("batch", "POST", "/v1/boards/main/scores/batch", {"events": [score()]}, SERVERS),
    ("define a board", "PUT", "/v1/boards/b-{cred}", {"operator": "best"}, ADMINS),
    ("list boards", "GET", "/v1/boards", None, OPEN_READ),
    ("one board", "GET", "/v1/boards/main", None, OPEN_READ),
    ("global board", "GET", "/v1/boards/main/leaderboard?scope=global", None, OPEN_READ),
    ("region board", "GET", "/v1/boards/main/leaderboard?scope=region:eu", None, OPEN_READ),
    ("teams board", "GET", "/v1/boards/main/leaderboard?scope=teams", None, OPEN_READ),
    ("friends board", "GET", "/v1/boards/main/leaderboard?scope=friends:u-1", None, OWN),
    ("standing", "GET", "/v1/boards/main/users/u-1?scope=region:eu", None, OPEN_READ),
    ("ranks", "GET", "/v1/boards/main/users/u-1/ranks", None, OPEN_READ),
    ("events", "GET", "/v1/boards/main/users/u-1/events", None, OWN),
    ("badges", "GET", "/v1/boards/main/users/u-1/badges", None, OPEN_READ),
    ("feed", "GET", "/v1/boards/main/feed", None, OPEN_READ),
    ("stats", "GET", "/v1/boards/main/stats", None, OPEN_READ),
    ("befriend", "PUT", "/v1/users/u-1/friends/u-3", None, ASKS),
    ("friends", "GET", "/v1/users/u-1/friends", None, OWN),
    ("friend requests", "GET", "/v1/users/u-1/friends/requests", None, OWN),
    ("unfriend", "DELETE", "/v1/users/u-1/friends/u-3", None, OWN_204),
]
PRIVATE_READS = {"none": 401, "bad": 401, "self": 200, "other": 200, "server": 200, "admin": 200}


async def seeded(client: httpx.AsyncClient, redis: Redis, settings: LadderSettings) -> None:
    """Board ``open`` takes player writes; u-1 has a score on main, derived (its regions) as
    the aggregator would (the broker is unreachable: the event waits in the outbox)."""
    response = await client.put(
        "/v1/boards/open", json={"player_writes": True, "regions": ["eu"]}, headers=ADMIN
    )
    assert response.status_code == 201, response.text
    response = await client.post("/v1/boards/main/scores", json=score(), headers=SERVER)
    assert response.status_code == 200, response.text
    await derive_outbox(redis, Keys(settings.key_prefix), MAIN_BOARD, settings.feed_length)


def cells() -> Iterator[Any]:
    for name, method, path, body, expected in MATRIX:
        for cred, status in expected.items():
            yield pytest.param(method, path, body, cred, status, id=f"{name}-{cred}-{status}")


@pytest.mark.parametrize(("method", "path", "body", "cred", "status"), list(cells()))
async def test_the_credential_matrix(
    quiet: LadderSettings,
    redis: Redis,
    broker: Topology,
    method: str,
    path: str,
    body: Any,
    cred: str,
    status: int,
) -> None:
    async with api_client(quiet) as client:
        await seeded(client, redis, quiet)
        response = await client.request(
            method, path.format(cred=cred), json=body, headers=CREDENTIALS[cred]
        )
    assert response.status_code == status, response.text
    if status >= 400:
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["status"] == status


@pytest.mark.parametrize(
    "path",
    [
        "/v1/boards",
        "/v1/boards/main/leaderboard?scope=global",
        "/v1/boards/main/users/u-1?scope=region:eu",
        "/v1/boards/main/feed",
        "/v1/boards/main/stats",
    ],
)
async def test_reads_need_a_credential_when_they_are_not_public(
    quiet: LadderSettings, redis: Redis, broker: Topology, path: str
) -> None:
    private = quiet.model_copy(update={"public_reads": False})
    async with api_client(private) as client:
        await seeded(client, redis, private)
        for cred, status in PRIVATE_READS.items():
            response = await client.get(path, headers=CREDENTIALS[cred])
            assert response.status_code == status, (cred, response.text)


@pytest.mark.parametrize("header", ["", " ", "Bearer", "Bearer  "])
async def test_a_blank_authorization_header_is_a_credential_refused_first(
    quiet: LadderSettings, redis: Redis, header: str
) -> None:
    """An ``Authorization`` header that is there but blank is no way around the credential
    check: 401 before the board is looked up (no telling which boards exist) and before the
    body is read, also where reads are public."""
    blank = {"Authorization": header}
    private = quiet.model_copy(update={"public_reads": False})
    async with api_client(private) as client:
        unknown = await client.get("/v1/boards/no-such-board", headers=blank)
        malformed = await client.put(
            "/v1/boards/b-blank", content=b"{not json", headers={**blank, **JSON}
        )
    async with api_client(quiet) as client:
        public = await client.get("/v1/boards/main/leaderboard", headers=blank)
    for response in (unknown, malformed, public):
        assert response.status_code == 401, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
    assert not await redis.hexists(Keys(quiet.key_prefix).boards, "b-blank")


@pytest.mark.parametrize(
    ("method", "path", "cred", "status"),
    [
        ("PUT", "/v1/boards/b-new", "bad", 401),
        ("PUT", "/v1/boards/b-new", "server", 403),
        ("PUT", "/v1/boards/b-new", "admin", 400),
        ("POST", "/v1/boards/main/scores/batch", "bad", 401),
        ("POST", "/v1/boards/main/scores/batch", "self", 403),
        ("POST", "/v1/boards/no-such-board/scores/batch", "server", 404),
        ("POST", "/v1/boards/main/scores/batch", "server", 400),
    ],
)
async def test_a_body_that_is_not_json_is_judged_after_the_credential_and_the_board(
    quiet: LadderSettings, redis: Redis, method: str, path: str, cred: str, status: int
) -> None:
    """The order of docs/api.md section 1 holds for the routes whose body FastAPI reads too:
    the credential (401, 403), then the board (404), then the body (400); nothing is written."""
    keys = Keys(quiet.key_prefix)
    async with api_client(quiet) as client:
        before = await redis.hgetall(keys.boards)
        response = await client.request(
            method, path, content=b'{"events": [', headers={**CREDENTIALS[cred], **JSON}
        )
        after = await redis.hgetall(keys.boards)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert after == before


# --- rate limits across two API processes -----------------------------------------------------


def api_process(settings: LadderSettings, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
    env.update(
        LADDER_KEY_PREFIX=settings.key_prefix,
        LADDER_BROKER_PREFIX=settings.broker_prefix,
        **redis_env(settings),
        LADDER_AMQP_URL=UNREACHABLE_BROKER,
        LADDER_MYSQL_URL=settings.mysql_url,
        LADDER_API_PORT=str(port),
        LADDER_USER_RATE="5",
        LADDER_LOG_LEVEL="WARNING",
    )
    return spawn_api(env)


async def wait_ready(client: httpx.AsyncClient, url: str) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            if (await client.get(f"{url}/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(url)


async def test_the_user_rate_is_shared_by_two_api_processes(
    settings: LadderSettings, redis: Redis, broker: Topology
) -> None:
    ports = [free_port(), free_port()]
    processes = [api_process(settings, port) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        async with httpx.AsyncClient(headers=SERVER, timeout=10) as client:
            for url in urls:
                await wait_ready(client, url)
            started = time.monotonic()
            responses = await asyncio.gather(
                *(
                    client.post(f"{urls[i % 2]}/v1/boards/main/scores", json=score("u-rl"))
                    for i in range(40)
                )
            )
            elapsed = time.monotonic() - started
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)
    accepted = [r for r in responses if r.status_code == 200]
    limited = [r for r in responses if r.status_code == 429]
    assert len(accepted) + len(limited) == 40
    # A burst of twice the rate (10), and the rate (5 a second) while the requests ran.
    assert 10 <= len(accepted) <= 10 + 5 * elapsed + 1
    for response in limited:
        assert int(response.headers["retry-after"]) >= 1
        assert response.headers["content-type"].startswith("application/problem+json")
    # Both processes answered both ways: the buckets are shared, not per process.
    by_port = {
        url: {r.status_code for r in responses if str(r.url).startswith(url)} for url in urls
    }
    assert any(200 in codes for codes in by_port.values())
    assert all(429 in codes for codes in by_port.values())
    keys = Keys(settings.key_prefix)
    stored = await stored_score(
        redis, keys.region_view("main", "alltime", "all", "eu"), "u-rl", True
    )
    assert stored == len(accepted)
    print(
        f"40 posts over two processes in {elapsed:.2f} s: {len(accepted)} accepted, "
        f"{len(limited)} refused with 429; the board holds {len(accepted)}"
    )


# --- prod refuses dev defaults -------------------------------------------------------------------


@pytest.mark.parametrize("service", ["services.api", "services.notifier"])
def test_prod_refuses_to_start_with_dev_defaults(service: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
    env.update(
        LADDER_ENV="prod",
        LADDER_SERVER_KEYS="dev-server-key",
        LADDER_JWT_SECRET="dev-jwt-secret",
    )
    done = run([sys.executable, "-m", service], env=env)
    assert done.returncode == 2
    assert "LADDER_SERVER_KEYS holds a development key" in done.stderr
    assert "LADDER_ADMIN_KEYS is not set" in done.stderr
    assert "LADDER_JWT_SECRET is the development secret" in done.stderr


def test_prod_refuses_a_short_jwt_secret() -> None:
    with pytest.raises(ValueError, match="shorter than 32 bytes"):
        LadderSettings(
            _env_file=None,  # type: ignore[call-arg]
            env="prod",
            server_keys=["s" * 40],
            admin_keys=["a" * 40],
            jwt_secret="too-short",
        )
