"""Two API worker processes on one port (LADDER_API_WORKERS=2): they share the outbox, so every
accepted event is published once; /metrics counts what both answered; SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import orjson
from redis.asyncio import Redis

from shared.amqp import connect as connect_broker
from shared.keys import OUTBOX_GROUP, Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import eventually
from tests.stack import free_port, redis_env, spawn_api

SERVER = {"Authorization": "Bearer dev-server-key"}
POSTS = 30


def workers_of(pid: int) -> set[int]:
    """The worker processes of an API parent (not multiprocessing's resource tracker)."""
    return {p for p in children(pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()}


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The parent pid is the second field after the command, which is in parentheses.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


async def test_two_workers_share_the_port_the_outbox_and_the_metrics(
    settings: LadderSettings, redis: Redis, broker: Topology
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
    env.update(
        LADDER_API_WORKERS="2",
        LADDER_API_PORT=str(port),
        LADDER_KEY_PREFIX=settings.key_prefix,
        LADDER_BROKER_PREFIX=settings.broker_prefix,
        **redis_env(settings),
        LADDER_AMQP_URL=settings.amqp_url,
        LADDER_MYSQL_URL=settings.mysql_url,
        LADDER_LOG_LEVEL="WARNING",
    )
    process = spawn_api(env)
    workers: set[int] = set()
    url = f"http://127.0.0.1:{port}"
    connection = await connect_broker(settings.amqp_urls)
    try:
        channel = await connection.channel()
        queue = (await broker.declare(channel))["history"]

        async def up() -> bool | None:
            try:
                async with httpx.AsyncClient() as client:
                    return (await client.get(f"{url}/readyz")).status_code == 200 or None
            except httpx.TransportError:
                return None

        await eventually(up, within=60)
        workers = workers_of(process.pid)
        assert len(workers) == 2
        statuses = []
        for i in range(POSTS):
            # A fresh connection each: the kernel hands them to either worker.
            async with httpx.AsyncClient() as client:
                response = await client.post(
                    f"{url}/v1/boards/main/scores",
                    json={"event_id": f"w-{i}", "user_id": f"u-{i}", "region": "eu", "value": 1},
                    headers=SERVER,
                )
                statuses.append(response.status_code)
        assert statuses == [200] * POSTS

        # Both relays read one consumer group: each event is published once, none is left.
        event_ids: list[str] = []

        async def all_published() -> bool | None:
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                event_ids.extend(e["event_id"] for e in orjson.loads(message.body)["events"])
            return len(event_ids) >= POSTS or None

        await eventually(all_published, within=30)
        await asyncio.sleep(0.5)
        await all_published()
        assert sorted(event_ids) == sorted(f"w-{i}" for i in range(POSTS))
        outbox = Keys(settings.key_prefix).outbox("main")
        assert await redis.xlen(outbox) == 0
        pending = await redis.xpending(outbox, OUTBOX_GROUP)
        assert pending["pending"] == 0

        # Whichever worker answers /metrics counts what both accepted.
        async with httpx.AsyncClient() as client:
            for _ in range(4):
                metrics = (await client.get(f"{url}/metrics")).text
                assert f'ladder_api_scores_total{{outcome="accepted"}} {POSTS}.0' in metrics
    finally:
        await connection.close()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0
    assert not alive(workers)
