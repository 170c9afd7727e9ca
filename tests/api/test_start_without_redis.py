"""The API started while its Redis is down (docs/api.md section 10): its own server listens at
once, ``/healthz`` answers 200 and ``/readyz`` 503 naming ``redis`` and why, requests that need
Redis answer a 503 problem as on an outage, and once Redis answers the API opens it (the
function library, board ``main``) and serves. The server runs in this process, reaching Redis
through a relay that the test keeps closed (what a client sees of a server that is down), then
opens; a Redis that answers with a database it has not stops the server, as it did at start."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from redis.asyncio import Redis
from websockets.exceptions import InvalidStatus

from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, SCORES, assert_problem, score
from tests.conftest import ON_CLUSTER
from tests.helpers import SERVER, assert_waiting_on, eventually, production_server
from tests.outage import Outage
from tests.stack import ROOT, free_port, redis_env

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = [
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
    pytest.mark.skipif(ON_CLUSTER, reason="one relay stands for one Redis"),
]


async def test_the_api_started_without_redis_answers_and_opens_it_once_it_answers(
    quiet: LadderSettings, redis: Redis, mysql_database: str
) -> None:
    target = urlsplit(quiet.redis_url)
    relay = Outage(target.hostname or "127.0.0.1", target.port or 6379)
    settings = quiet.model_copy(update={"redis_url": relay.through(quiet.redis_url)})
    try:
        async with (
            asyncio.timeout(60),
            production_server(settings) as (server, ws),
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{server.config.port}", timeout=10
            ) as client,
        ):
            # Well past the first failed try (0.5 s).
            await asyncio.sleep(1.5)
            health = await client.get("/healthz")
            waiting = await client.get("/readyz")
            write = await client.post(SCORES, json=score(), headers=SERVER)
            read = await client.get(LEADERBOARD)
            with pytest.raises(InvalidStatus) as socket:
                async with websockets.connect(ws):
                    pass
            await relay.restore()

            async def ready() -> httpx.Response | None:
                answer = await client.get("/readyz")
                return answer if answer.status_code == 200 else None

            opened = await eventually(ready, within=30)
            write_after = await client.post(SCORES, json=score(), headers=SERVER)
    finally:
        await relay.cut()

    assert_waiting_on(health, waiting, "redis")
    assert_problem(write, 503)
    assert_problem(read, 503)
    assert socket.value.response.status_code == 503
    assert opened.json()["dependencies"]["redis"] == "up"
    # Opened: the function library loaded and board main defined, so a write is accepted.
    assert write_after.status_code == 200, write_after.text
    # The refused write kept nothing; the one after it is in the outbox.
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 1


async def test_an_api_that_finds_its_redis_without_its_database_once_it_answers_stops(
    quiet: LadderSettings,
) -> None:
    target = urlsplit(quiet.redis_url)
    relay = Outage(target.hostname or "127.0.0.1", target.port or 6379)
    beyond = relay.through(quiet.redis_url).rsplit("/", 1)[0] + "/99999"
    try:
        async with (
            asyncio.timeout(60),
            production_server(quiet.model_copy(update={"redis_url": beyond})) as (server, _),
        ):
            await asyncio.sleep(0.2)
            serving = not server.should_exit
            await relay.restore()

            async def stopped() -> bool:
                return server.failed_to_open

            await eventually(stopped, within=20)
    finally:
        await relay.cut()

    assert serving


def test_an_api_whose_redis_has_not_its_database_stops(quiet: LadderSettings) -> None:
    beyond = quiet.model_copy(update={"redis_url": quiet.redis_url.rsplit("/", 1)[0] + "/99999"})
    env = {
        "PATH": "/usr/bin:/bin",
        **redis_env(beyond),
        "LADDER_ENV": "dev",
        "LADDER_API_PORT": str(free_port()),
        "LADDER_AMQP_URL": quiet.amqp_url,
        "LADDER_MYSQL_URL": quiet.mysql_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.api"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "LADDER_REDIS_URL names a database" in done.stdout + done.stderr
