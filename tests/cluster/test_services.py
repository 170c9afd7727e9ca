"""The four services as processes on a private Redis Cluster (tests/stack.py's supervisord
stack, with more processes beside it): a write on one API process pushes to a socket on another,
and the global view keeps merging when an aggregator is killed and another takes its boards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from shared.settings import LadderSettings
from tests.cluster.conftest import on
from tests.helpers import SERVER, eventually, player_token
from tests.redis_cluster import PrivateCluster
from tests.stack import ROOT, Socket, Stack, answers_ok, free_port, spawn_api

pytestmark = pytest.mark.cluster

MERGE_INTERVAL = 1.0


@pytest.fixture
def settings(settings: LadderSettings, shared_cluster: PrivateCluster) -> LadderSettings:
    return on(shared_cluster, settings).model_copy(update={"merge_interval": MERGE_INTERVAL})


@pytest.fixture
def second_api(stack: Stack) -> Iterator[str]:
    """Another API process of the stack, on a port of its own; its base URL."""
    port = free_port()
    process = spawn_api({**stack.env, "LADDER_API_PORT": str(port), "LADDER_API_WORKERS": "1"})
    try:
        assert answers_ok(f"http://127.0.0.1:{port}/readyz", 60), "second API not ready"
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(20)


async def global_leader(api: httpx.AsyncClient, user: str) -> dict[str, Any] | None:
    page: dict[str, Any] = (await api.get("/v1/boards/main/leaderboard")).json()
    return page if page["entries"] and page["entries"][0]["user_id"] == user else None


async def test_a_write_on_one_api_pushes_to_a_socket_on_another(
    stack: Stack, second_api: str
) -> None:
    connection = await websockets.connect(f"ws://{second_api}/v1/ws?token={player_token('w')}")
    watcher = Socket(connection)
    await watcher.send({"op": "subscribe", "topic": "leaderboard:main:global:alltime"})
    await watcher.sync()
    hero = f"hero-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
        body = {"user_id": hero, "region": "eu", "value": 25}
        answer = await api.post("/v1/boards/main/scores", json=body)
        assert answer.status_code == 200, answer.text
    pushed = await watcher.expect(
        lambda m: m["type"] == "leaderboard" and any(e["user_id"] == hero for e in m["entries"]),
        within=20,
    )
    assert (pushed["scope"], pushed["period"]) == ("global", "alltime")
    await connection.close()


def aggregator_pid(stack: Stack) -> int:
    return int(stack.ctl("pid", "aggregator").strip())


@pytest.fixture
def second_aggregator(stack: Stack) -> Iterator[None]:
    """Another aggregator beside the stack's, on an ops port of its own."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "services.aggregator"],
        cwd=ROOT,
        env={**stack.env, "LADDER_AGGREGATOR_PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert answers_ok(f"http://127.0.0.1:{port}/readyz", 60), "second aggregator not ready"
        yield
    finally:
        process.terminate()
        process.wait(20)


@pytest.mark.usefixtures("second_aggregator")
async def test_the_global_view_keeps_merging_when_an_aggregator_is_killed(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
        first = f"first-{uuid.uuid4().hex[:6]}"
        body = {"user_id": first, "region": "eu", "value": 10}
        assert (await api.post("/v1/boards/main/scores", json=body)).status_code == 200
        await eventually(lambda: global_leader(api, first), within=20)
        # The supervised aggregator is killed (supervisord starts it again): the boards'
        # leases it held expire, and whichever aggregator takes them merges on.
        os.kill(aggregator_pid(stack), signal.SIGKILL)
        killed = time.monotonic()
        second = f"second-{uuid.uuid4().hex[:6]}"
        body = {"user_id": second, "region": "us", "value": 20}
        assert (await api.post("/v1/boards/main/scores", json=body)).status_code == 200
        await eventually(lambda: global_leader(api, second), within=20)
        merged_after = time.monotonic() - killed
    print(f"merged {merged_after:.1f} s after the kill (merge interval {MERGE_INTERVAL} s)")
    # Three merge intervals for the lease to expire, one for the merge, one of slack.
    assert merged_after < 5 * MERGE_INTERVAL
