"""Ladder in containers, end to end (make test-containers): deploy/compose.yml brought up by
scripts/containers.sh under a compose project and host ports of its own, then removed with its
volumes. A score posted to the API reaches MySQL and a WebSocket push; the management API lists
the three quorum queues with their consumers and the four services' named connections; the API
container restarted under a stream of writes loses no accepted event. Last, make containers-down
leaves none of the project's containers, networks and volumes.

Slow (images are built on the first run): kept out of make test and make test-stack by the
`containers` marker. Needs root or a Docker engine (scripts/containers.sh starts one).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.helpers import eventually

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "containers.sh"
QUEUES = ("ladder.scores.aggregator", "ladder.scores.history", "ladder.scores.notifier")
SERVICES = ("api", "aggregator", "history", "notifier")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Containers:
    env: dict[str, str]
    api: str
    ui: str

    def secret(self, name: str) -> str:
        for line in Path(self.env["LADDER_CONTAINERS_ENV_FILE"]).read_text().splitlines():
            if line.startswith(f"{name}="):
                return line.split("=", 1)[1]
        raise KeyError(name)

    def script(self, *args: str, timeout: float = 1500) -> str:
        done = subprocess.run(
            ["bash", str(SCRIPT), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr[-6000:]}"
        return done.stdout

    def sql(self, query: str) -> list[list[str]]:
        out = self.script(
            "compose", "exec", "-T", "-e", f"MYSQL_PWD={self.secret('MYSQL_PASSWORD')}",
            "mysql", "mariadb", "-uladder", "ladder", "--batch", "--skip-column-names",
            "-e", query, timeout=60,
        )  # fmt: skip
        return [line.split("\t") for line in out.splitlines() if line]

    @property
    def server(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret('LADDER_SERVER_KEYS').split(',')[0]}"}


@pytest.fixture(scope="module")
def containers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containers]:
    api_port, ui_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "LADDER_COMPOSE_PROJECT": f"ladder-test-{uuid.uuid4().hex[:8]}",
        "LADDER_PUBLISH_API_PORT": str(api_port),
        "LADDER_PUBLISH_UI_PORT": str(ui_port),
        "LADDER_CONTAINERS_ENV_FILE": str(tmp_path_factory.mktemp("containers") / ".env"),
    }
    stack = Containers(env, f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{ui_port}")
    try:
        stack.script("up")
        yield stack
    finally:
        stack.script("down", timeout=300)


async def _push_for(url: str, user: str) -> dict[str, Any]:
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"op": "subscribe", "topic": f"user:{user}"}))
        while True:
            message = json.loads(await ws.recv())
            if message.get("type") == "rank" and message.get("user_id") == user:
                return dict(message)


async def test_a_score_reaches_mysql_and_a_websocket_push(containers: Containers) -> None:
    user, event = f"u-{uuid.uuid4().hex[:8]}", f"e-{uuid.uuid4().hex}"
    token = containers.server["Authorization"][7:]
    ws_url = containers.api.replace("http://", "ws://") + f"/v1/ws?token={token}"
    push = asyncio.create_task(_push_for(ws_url, user))
    await asyncio.sleep(1)  # subscribed before the score is posted
    async with httpx.AsyncClient(base_url=containers.api, headers=containers.server) as api:
        body = {"event_id": event, "user_id": user, "region": "eu", "value": 42}
        answer = await api.post("/v1/boards/main/scores", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    message = await asyncio.wait_for(push, 30)
    assert message["reason"] == "entered_top" and message["score"] == 42, message

    async def stored() -> list[list[str]] | None:
        rows = await asyncio.to_thread(
            containers.sql,
            f"SELECT user_id, value FROM score_events WHERE event_id = '{event}'",
        )
        return rows or None

    assert await eventually(stored, within=30) == [[user, "42"]]


async def test_the_management_api_shows_the_queues_and_each_service_by_name(
    containers: Containers,
) -> None:
    monitor = ("ladder-monitor", containers.secret("LADDER_BROKER_MONITOR_PASSWORD"))
    async with httpx.AsyncClient(base_url=containers.ui, auth=monitor, timeout=10) as ui:
        whoami = (await ui.get("/api/whoami")).json()
        assert whoami["tags"] == ["monitoring"]

        async def consumed() -> dict[str, Any] | None:
            queues = {q["name"]: q for q in (await ui.get("/api/queues")).json()}
            ready = all(queues.get(name, {}).get("consumers", 0) >= 1 for name in QUEUES)
            return queues if ready else None

        queues = await eventually(consumed, within=60)
        for name in QUEUES:
            assert queues[name]["type"] == "quorum", name
            service = name.rsplit(".", 1)[1]
            details = (await ui.get(f"/api/queues/%2F/{name}")).json()["consumer_details"]
            assert all(d["consumer_tag"].startswith(f"ladder-{service}.") for d in details)

        async def named() -> set[str] | None:
            names = {
                c["client_properties"].get("connection_name", "")
                for c in (await ui.get("/api/connections")).json()
            }
            found = {s for s in SERVICES if any(n.startswith(f"ladder-{s} ") for n in names)}
            return found if found == set(SERVICES) else None

        assert await eventually(named, within=60) == set(SERVICES)


async def _post_stream(
    api: httpx.AsyncClient, run: str, worker: int, stop: asyncio.Event, tally: dict[str, set[str]]
) -> None:
    for i in range(1_000_000):
        if stop.is_set():
            return
        event = f"r-{run}-{worker}-{i}"
        body = {"event_id": event, "user_id": f"u-{run}-{worker}-{i}", "region": "eu", "value": i}
        try:
            answer = await api.post("/v1/boards/main/scores", json=body)
        except httpx.TransportError:
            tally["unanswered"].add(event)
            await asyncio.sleep(0.05)
            continue
        tally["accepted" if answer.is_success else "refused"].add(event)


async def test_the_api_restarted_under_load_loses_nothing(containers: Containers) -> None:
    run = uuid.uuid4().hex[:8]
    tally: dict[str, set[str]] = {"accepted": set(), "refused": set(), "unanswered": set()}
    stop = asyncio.Event()
    async with httpx.AsyncClient(
        base_url=containers.api, headers=containers.server, timeout=10
    ) as api:
        workers = [asyncio.create_task(_post_stream(api, run, w, stop, tally)) for w in range(4)]
        await asyncio.sleep(3)
        before = len(tally["accepted"])
        await asyncio.to_thread(containers.script, "compose", "restart", "api", timeout=180)

        async def ready() -> bool | None:
            try:
                return (await api.get("/readyz")).status_code == 200 or None
            except httpx.TransportError:
                return None

        await eventually(ready, within=120)
        after_restart = len(tally["accepted"])
        await asyncio.sleep(3)
        stop.set()
        await asyncio.gather(*workers)
    accepted = tally["accepted"]
    print(
        f"accepted {len(accepted)} ({before} before the restart, "
        f"{len(accepted) - after_restart} after it was ready again); "
        f"unanswered {len(tally['unanswered'])}; refused {len(tally['refused'])}"
    )
    assert before > 0 and len(accepted) > after_restart, "writes did not go on around it"

    async def stored() -> dict[str, int] | None:
        rows = await asyncio.to_thread(
            containers.sql,
            "SELECT event_id, COUNT(*) FROM score_events "
            f"WHERE event_id LIKE 'r-{run}-%' GROUP BY event_id",
        )
        counts = {event: int(count) for event, count in rows}
        return counts if accepted <= set(counts) else None

    counts = await eventually(stored, within=120)
    assert all(counts[event] == 1 for event in accepted), "an accepted event stored twice"
    assert set(counts) <= accepted | tally["unanswered"], "an event stored that was refused"
    assert all(count == 1 for count in counts.values())


def test_the_ladder_image_refuses_a_short_key(containers: Containers) -> None:
    """The image defaults to LADDER_ENV=prod: a service started from it with a key under 32
    bytes exits at once and says which setting, never the key."""
    short = "short-key-" + uuid.uuid4().hex[:6]
    done = subprocess.run(
        ["bash", str(SCRIPT), "compose", "run", "--rm", "--no-deps", "-T",
         "-e", f"LADDER_SERVER_KEYS={short}", "api", "python", "-m", "services.api"],
        env=containers.env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "LADDER_ENV=prod refuses to start" in said, said[-3000:]
    assert "LADDER_SERVER_KEYS: key 1 of 1 is shorter than 32 bytes" in said, said[-3000:]
    assert short not in said


def _resources(containers: Containers) -> dict[str, list[str]]:
    """The compose project's containers, networks and volumes, as the engine lists them by the
    label compose puts on each (the engine started again if ``down`` stopped it: the fixture's
    own ``down`` stops it once more)."""
    engine = containers.script("engine", timeout=180).strip().splitlines()[-1]
    assert engine.startswith("DOCKER_HOST="), engine
    env = {**containers.env, "DOCKER_HOST": engine.split("=", 1)[1]}
    label = f"label=com.docker.compose.project={containers.env['LADDER_COMPOSE_PROJECT']}"
    found = {}
    for kind, command, name in (
        ("containers", ["ps", "--all"], "{{.Names}}"),
        ("networks", ["network", "ls"], "{{.Name}}"),
        ("volumes", ["volume", "ls"], "{{.Name}}"),
    ):
        done = subprocess.run(
            ["docker", *command, "--filter", label, "--format", name],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        found[kind] = sorted(done.stdout.split())
    return found


async def _engine_settled(containers: Containers) -> bool:
    """The engine that scripts/containers.sh started answers still (other containers on it), or
    is gone: not exiting, its pid file left, which an engine started then would refuse."""
    state = Path(containers.env.get("LADDER_DOCKER_DIR", "/var/lib/ladder-docker"))
    if not (state / "dockerd.pid").exists():
        return True
    done = await asyncio.to_thread(
        subprocess.run,
        ["docker", "-H", f"unix://{state / 'docker.sock'}", "info"],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    return done.returncode == 0


async def test_containers_down_removes_the_containers_networks_and_volumes(
    containers: Containers,
) -> None:
    """``make containers-down``: the module's last test (the fixture's ``down`` then finds
    nothing left to remove)."""
    before = await asyncio.to_thread(_resources, containers)
    for service in ("redis", "rabbitmq", "mysql", *SERVICES):  # compose 1 names them p_s_1
        assert any(f"_{service}_" in c or f"-{service}-" in c for c in before["containers"])
    assert before["networks"], before
    assert len(before["volumes"]) == 3, before
    done = await asyncio.to_thread(
        subprocess.run,
        ["make", "-s", "containers-down"],
        cwd=ROOT, env=containers.env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    # The engine the script started stops once no container is left on it: asked again after.
    await eventually(lambda: _engine_settled(containers), within=60)
    after = await asyncio.to_thread(_resources, containers)
    assert after == {"containers": [], "networks": [], "volumes": []}
