"""The API's CPU per read, in-process: the reads of ``make bench`` (rank, around-me, top-100) and
a few more, sent one at a time over httpx's ASGI transport to the real app, on a board filled
straight into Redis, beside the bare endpoint (bench/bare.py) sent the same way.

It is a comparison, not a figure of ``make bench``: the client's own CPU is in every row, which
is why the bare endpoint is measured alike, and why the rows are read as differences to it and as
ratios between two versions of the code on the same machine. It also counts the Redis round
trips of each read (``INFO commandstats`` calls are not round trips: the client's sends are
counted by wrapping the connections' ``send_packed_command``).

A second column gives each read's CPU with no client at all: the app called as an ASGI app with
a request's scope, as a server calls it (``app_alone``). Without the client's own CPU and its
variance (as much again as the read's own, on a shared machine) it tells apart changes of a few
µs that the first column does not.

``python -m bench.read_cpu [members] [requests] [redis URL]`` (by default a private
redis-server on port 6393, db 1) with an unreachable broker and MySQL: the read paths need
neither.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from redis.asyncio.connection import Connection

from bench import bare, probes
from services.api.app import create_app
from shared.keys import Keys
from shared.redis import PackedConnection, open_redis
from shared.settings import LadderSettings

PREFIX = "lt-readcpu"
BOARD = "main"
_sends = 0


def _counting(send: Callable[..., Any]) -> Callable[..., Any]:
    async def counted(self: Connection, *args: Any, **kwargs: Any) -> Any:
        global _sends
        _sends += 1
        return await send(self, *args, **kwargs)

    return counted


def paths(members: int) -> dict[str, list[str]]:
    chosen = probes.read_paths(BOARD, members, count=200)
    base, query = f"/v1/boards/{BOARD}", "scope=region:eu&period=alltime"
    users = [p.split("/users/")[1].split("?")[0] for p in chosen["rank"]]
    chosen["rank, competition"] = [
        f"{base}/users/{u}?{query}&rank_style=competition" for u in users
    ]
    chosen["top-10"] = [f"{base}/leaderboard?{query}"]
    chosen["top-10, dense"] = [f"{base}/leaderboard?{query}&rank_style=dense"]
    return chosen


async def per_request(client: httpx.AsyncClient, urls: list[str], n: int) -> tuple[float, float]:
    """CPU µs and Redis sends per request: the median of five rounds of ``n / 5`` sequential
    requests, after 100 more to warm up. The median, because the machine is shared and the
    app's background tasks (the relay and restorer retrying their broker and database) wake up
    now and then inside a round."""
    for i in range(100):
        assert (await client.get(urls[i % len(urls)])).status_code == 200, urls[i % len(urls)]
    rounds: list[tuple[float, float]] = []
    for _ in range(5):
        sends_before, cpu, count = _sends, 0.0, max(n // 5, 1)
        for i in range(count):
            started = time.process_time()
            response = await client.get(urls[i % len(urls)])
            cpu += time.process_time() - started
            assert response.status_code == 200, response.text
        rounds.append((1e6 * cpu / count, (_sends - sends_before) / count))
    return sorted(rounds)[2]


def _scope(url: str) -> dict[str, Any]:
    path, _, query = url.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"t")],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
    }


async def app_alone(app: Any, urls: list[str], n: int) -> float:
    """CPU µs per request of ``app`` called with each request's scope, with no client: the
    median of five rounds of ``n / 5``, after 100 more."""
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def one(url: str) -> None:
        await app(_scope(url), receive, send)

    for i in range(100):
        await one(urls[i % len(urls)])
    rounds: list[float] = []
    for _ in range(5):
        count = max(n // 5, 1)
        started = time.process_time()
        for i in range(count):
            await one(urls[i % len(urls)])
        rounds.append(1e6 * (time.process_time() - started) / count)
    assert set(statuses) == {200}, set(statuses)
    return sorted(rounds)[2]


async def main(members: int, n: int, redis_url: str) -> None:
    settings = LadderSettings(
        _env_file=None,
        env="dev",
        redis_url=redis_url,
        amqp_url="amqp://guest:guest@127.0.0.1:1/",
        mysql_url="mysql+asyncmy://root@127.0.0.1:1/ladder_readcpu",
        key_prefix=PREFIX,
        broker_prefix=PREFIX,
    )
    keys = Keys(PREFIX)
    view = keys.region_view(BOARD, "alltime", "all", "eu")
    async with open_redis(redis_url) as redis:
        if await redis.zcard(view) != members:
            await redis.unlink(view, Keys.ties(view))
            await probes.fill_board(redis, view, members)
    # Ladder's connections (PackedConnection) send with a send of their own.
    for cls in (Connection, PackedConnection):
        cls.send_packed_command = _counting(cls.send_packed_command)  # type: ignore[method-assign]
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            rows = {
                name: await per_request(client, urls, n) for name, urls in paths(members).items()
            }
        # The lifespan's app: the app with the lifespan's state put in each request's scope.
        alone = {name: await app_alone(manager.app, u, n) for name, u in paths(members).items()}
    bare_transport = httpx.ASGITransport(bare.app)
    async with httpx.AsyncClient(transport=bare_transport, base_url="http://t") as client:
        rows["bare GET /healthz"] = await per_request(client, ["/healthz"], n)
    alone["bare GET /healthz"] = await app_alone(bare.app, ["/healthz"], n)
    for name, (cpu, sends) in rows.items():
        print(
            f"{name:22} {cpu:8.0f} µs CPU  {sends:4.1f} Redis round trips"
            f"  {alone[name]:6.1f} µs CPU app alone"
        )


if __name__ == "__main__":
    asyncio.run(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 100_000,
            int(sys.argv[2]) if len(sys.argv) > 2 else 2000,
            sys.argv[3] if len(sys.argv) > 3 else "redis://127.0.0.1:6393/1",
        )
    )
