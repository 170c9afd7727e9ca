"""The API's ``/readyz`` against a Redis of the test's own that stops and starts again
(docs/api.md section 10): 503 exactly while the API cannot work with it, 200 again once it can.
A Redis that comes back without its data has lost the function library every score write and
read calls, so the API cannot work with it although it answers a ping."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis as sync_redis
from redis.asyncio import Redis

from services.aggregator import main as aggregator_main
from services.history import main as history_main
from services.notifier import main as notifier_main
from shared.boards import Board
from shared.keys import Keys
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.api.helpers import SCORES, add_board, assert_problem, score
from tests.helpers import SERVER, api_client, eventually, in_process
from tests.outage import relayed
from tests.stack import free_port

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

CONSUMERS: dict[str, Callable[[LadderSettings], Coroutine[Any, Any, None]]] = {
    "aggregator": aggregator_main.run,
    "notifier": notifier_main.run,
    "history": history_main.run,
}


class OwnRedis:
    """A ``redis-server`` of this test, without persistence, stopped and started on one port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(sync_redis.RedisError),
                sync_redis.Redis(port=self.port, socket_timeout=1) as client,
            ):
                if client.ping():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _readiness(client: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
    answer = await client.get("/readyz")
    body: dict[str, Any] = answer.json()
    return answer.status_code, body


async def _status(client: httpx.AsyncClient, wanted: int) -> tuple[int, dict[str, Any]] | None:
    """``/readyz``'s status and body if its status is ``wanted``; else (or while nothing
    listens yet) None."""
    with contextlib.suppress(httpx.TransportError):
        answer = await _readiness(client)
        return answer if answer[0] == wanted else None
    return None


async def _past_stale_connections(client: httpx.AsyncClient) -> tuple[int, dict[str, Any]] | None:
    """``/readyz`` once its Redis is no longer reached through a connection to the stopped
    server: the pool's connections to it fail once each, then are made anew."""
    answer = await _readiness(client)
    why = answer[1]["reasons"].get("redis", "")
    return None if why.startswith("ConnectionError") else answer


@contextlib.asynccontextmanager
async def _consumer(service: str, settings: LadderSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The consumer run in this process for the block (see ``in_process``), and a client of its
    ops port (``<service>_port`` of ``settings``)."""
    ops = f"http://127.0.0.1:{getattr(settings, f'{service}_port')}"
    async with (
        in_process(CONSUMERS[service](settings)),
        httpx.AsyncClient(base_url=ops, timeout=5) as client,
    ):
        yield client


async def test_readyz_follows_a_redis_that_stops_and_comes_back_empty(
    quiet: LadderSettings, own_redis: OwnRedis
) -> None:
    settings = quiet.model_copy(update={"redis_url": own_redis.url, "redis_cluster": False})
    async with api_client(settings) as client:
        ready = await _readiness(client)
        written = await client.post(SCORES, json=score(event_id="a-1"), headers=SERVER)

        own_redis.stop()
        down = await _readiness(client)
        refused = await client.post(SCORES, json=score(event_id="a-2"), headers=SERVER)

        # Back without its data: it answers a ping, but every write and read fails.
        own_redis.start()
        read = await client.get("/v1/boards/main/leaderboard")
        back_empty = await eventually(lambda: _past_stale_connections(client), within=5)

        # What `make rebuild` does first: the library loaded again.
        async with open_redis(own_redis.url, load_functions=True):
            pass

        async def ready_again() -> tuple[int, dict[str, Any]] | None:
            answer = await _readiness(client)
            return answer if answer[0] == 200 else None

        again = await eventually(ready_again, within=5)

    assert ready[0] == 200 and ready[1]["dependencies"]["redis"] == "up"
    assert written.status_code == 200
    assert down[0] == 503 and down[1]["dependencies"]["redis"] == "down"
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert read.status_code == 503
    # The API cannot work with this Redis: /readyz says so, and why.
    assert back_empty[0] == 503, back_empty
    assert back_empty[1]["dependencies"]["redis"] == "down"
    assert "function library" in back_empty[1]["reasons"]["redis"]
    assert again[1]["dependencies"]["redis"] == "up"


async def test_readyz_is_quick_with_the_library_in_place(
    quiet: LadderSettings, own_redis: OwnRedis
) -> None:
    """The library check is one command: readiness stays 200 under a stream of probes."""
    settings = quiet.model_copy(update={"redis_url": own_redis.url, "redis_cluster": False})
    async with api_client(settings) as client:
        answers = await asyncio.gather(*(_readiness(client) for _ in range(20)))
    assert {status for status, _ in answers} == {200}
    assert all(body["dependencies"]["redis"] == "up" for _, body in answers)


@pytest.mark.parametrize("service", ["aggregator", "notifier"])
async def test_a_consumers_readyz_follows_a_redis_that_comes_back_empty(
    service: str, settings: LadderSettings, broker: Topology, own_redis: OwnRedis
) -> None:
    port = free_port()
    settings = settings.model_copy(
        update={
            "redis_url": own_redis.url,
            "redis_cluster": False,
            f"{service}_port": port,
            "shutdown_grace_seconds": 1.0,
        }
    )
    async with _consumer(service, settings) as client:
        await eventually(lambda: _status(client, 200), within=15)
        head = await client.head("/readyz")
        own_redis.stop()
        down = await eventually(lambda: _status(client, 503), within=5)
        # Back without its data: it answers a ping, but its handler calls the library.
        own_redis.start()
        back_empty = await eventually(lambda: _past_stale_connections(client), within=5)
        async with open_redis(own_redis.url, load_functions=True):
            pass
        again = await eventually(lambda: _status(client, 200), within=5)

    # HEAD answers as GET does, without the body (on the API as well, below).
    assert (head.status_code, head.content) == (200, b"")
    assert down[1]["dependencies"]["redis"] == "down"
    assert back_empty[0] == 503, back_empty
    assert back_empty[1]["dependencies"]["redis"] == "down"
    assert "function library" in back_empty[1]["reasons"]["redis"]
    assert again[1]["dependencies"] == {"broker": "up", "redis": "up"}


@pytest.mark.parametrize(
    ("service", "dependency"),
    [("notifier", "broker"), ("aggregator", "broker"), ("history", "mysql")],
)
async def test_a_consumers_readyz_flips_while_a_dependency_goes_away_and_back(
    service: str,
    dependency: str,
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    mysql_database: str,
) -> None:
    port = free_port()
    setting = "amqp_url" if dependency == "broker" else "mysql_url"
    target = urlsplit(getattr(settings, setting))
    async with relayed(target.hostname or "127.0.0.1", target.port or 0) as relay:
        settings = settings.model_copy(
            update={
                setting: relay.through(getattr(settings, setting)),
                f"{service}_port": port,
                "shutdown_grace_seconds": 1.0,
            }
        )
        async with _consumer(service, settings) as client:
            await eventually(lambda: _status(client, 200), within=20)
            await relay.cut()
            down = await eventually(lambda: _status(client, 503), within=15)
            await relay.restore()
            again = await eventually(lambda: _status(client, 200), within=20)

    assert down[1]["dependencies"][dependency] == "down"
    assert down[1]["reasons"][dependency]
    assert "127.0.0.1" not in str(down[1]["reasons"])
    assert again[1]["dependencies"][dependency] == "up"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/"])
async def test_the_apis_operations_endpoints_answer_head_as_get(
    path: str, quiet: LadderSettings, redis: Redis
) -> None:
    """A server that answers GET answers HEAD (RFC 9110, section 9.1): uptime monitors and
    `curl -I` probe with HEAD, and the consumers' ops endpoints answer it already."""
    async with api_client(quiet) as client:
        got = await client.get(path)
        head = await client.head(path)

    assert head.status_code == got.status_code == 200
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.content == b""


async def test_the_outbox_bound_is_each_boards(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """With the broker away, each board's outbox holds up to LADDER_OUTBOX_MAX events; past it
    that board's writes answer 503 (problem+json, Retry-After) while another board's go on."""
    settings = quiet.model_copy(update={"outbox_max": 2})
    async with api_client(settings) as client:
        await add_board(redis, keys, Board(board_id="cup"))
        kept = [
            await client.post(SCORES, json=score(event_id=f"k-{n}"), headers=SERVER)
            for n in range(2)
        ]
        full = await client.post(SCORES, json=score(event_id="k-2"), headers=SERVER)
        other = await client.post(
            "/v1/boards/cup/scores", json=score(event_id="c-1"), headers=SERVER
        )
        ready = await _readiness(client)

    assert [answer.status_code for answer in kept] == [200, 200]
    assert_problem(full, 503)
    assert other.status_code == 200, other.text
    assert await redis.xlen(keys.outbox("main")) == 2
    assert await redis.xlen(keys.outbox("cup")) == 1
    # The broker is not what the API cannot work without: still ready.
    assert ready[0] == 200 and ready[1]["dependencies"]["broker"] == "down"
