"""The suite's one launcher of processes: a command run to its end, a wait for what must answer,
free ports, and a whole Ladder for one test (:class:`Stack`: the four services under the
project's own supervisord config, with the test's prefixes, database and free ports, driven
through the Makefile's targets). The fault suite's private servers (:mod:`tests.faults.servers`)
and its :class:`tests.faults.stack.FaultStack` start and stop through it too."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets

from shared.settings import LadderSettings

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("api", "aggregator", "history", "notifier")
SUPERVISOR_CONF = str(ROOT / "deploy/supervisord.conf")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port below the kernel's ephemeral range. A server binds it only later (a service
    once it has started, RabbitMQ's distribution port well into its boot, and again on every
    restart), and a port of the ephemeral range may meanwhile become the local end of any
    outgoing connection on the machine: a port below it is taken only by someone who asks for
    it by number."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def run(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """``command`` run to its end, its output captured as text. Its exit status is the caller's
    to judge: nothing is raised for it."""
    return subprocess.run(
        list(command),
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(
    what: str, probe: Callable[[], object], timeout: float, interval: float = 0.05
) -> None:
    """Poll ``probe`` until it answers truthy; ``TimeoutError`` naming ``what`` after ``timeout``
    seconds. Whatever ``probe`` raises goes through (a server that died while starting)."""
    end = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > end:
            raise TimeoutError(f"{what} after {timeout} s")
        time.sleep(interval)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def answers_ok(url: str, within: float) -> bool:
    """Whether ``url`` answers 200 within ``within`` seconds (polled every 0.1 s)."""
    try:
        wait_for(url, lambda: _answers(url), within, interval=0.1)
    except TimeoutError:
        return False
    return True


def redis_env(settings: LadderSettings) -> dict[str, str]:
    """The environment that points a Ladder process at the tests' Redis, one or a cluster."""
    return {
        "LADDER_REDIS_URL": settings.redis_url,
        "LADDER_REDIS_CLUSTER": "true" if settings.redis_cluster else "false",
    }


def spawn_api(env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """``python -m services.api`` as a process of its own with ``env``, its output dropped."""
    return subprocess.Popen(
        [sys.executable, "-m", "services.api"],
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@dataclass
class Stack:
    settings: LadderSettings
    run_dir: Path
    ports: dict[str, int] = field(default_factory=lambda: {s: free_port() for s in SERVICES})
    # Settings on top of the test's own (the fault suite's rates and grace periods).
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
        s = self.settings
        env.update(
            LADDER_ENV="dev",
            LADDER_KEY_PREFIX=s.key_prefix,
            LADDER_BROKER_PREFIX=s.broker_prefix,
            **redis_env(s),
            LADDER_AMQP_URL=s.amqp_url,
            LADDER_MYSQL_URL=s.mysql_url,
            LADDER_MERGE_INTERVAL=str(s.merge_interval),
            LADDER_API_PORT=str(self.ports["api"]),
            LADDER_AGGREGATOR_PORT=str(self.ports["aggregator"]),
            LADDER_HISTORY_PORT=str(self.ports["history"]),
            LADDER_NOTIFIER_PORT=str(self.ports["notifier"]),
            LADDER_RUN_DIR=str(self.run_dir),
            LADDER_PYTHON=sys.executable,
            LADDER_ROOT=str(ROOT),
        )
        env.update(self.extra_env)
        return env

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.ports['api']}/v1/ws"

    def ops(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def make(self, *args: str) -> str:
        done = run(["make", "-s", "--no-print-directory", *args], env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"make {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> None:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", SUPERVISOR_CONF],
            cwd=ROOT,
            env=self.env,
            check=True,
            timeout=30,
        )
        for service in SERVICES:
            self.wait_ready(service)

    def wait_ready(self, service: str, deadline: float = 60.0) -> None:
        url = (self.api if service == "api" else self.ops(service)) + "/readyz"
        if not answers_ok(url, deadline):
            raise TimeoutError(f"{service} not ready after {deadline} s\n{self.log(service)}")

    def log(self, service: str) -> str:
        path = self.run_dir / "logs" / f"{service}.log"
        return path.read_text()[-4000:] if path.exists() else "(no log)"

    def ctl(self, *args: str) -> str:
        """supervisorctl of this stack (the Makefile's SUPERVISORCTL); what it printed."""
        return run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", SUPERVISOR_CONF, *args],
            env=self.env,
        ).stdout

    def shutdown(self) -> None:
        self.ctl("shutdown")
        # supervisorctl returns once the shutdown is under way; wait for the programs to go.
        pidfile = self.run_dir / "supervisord.pid"
        end = time.monotonic() + 30
        while pidfile.exists() and time.monotonic() < end:
            time.sleep(0.1)


class Socket:
    """A WebSocket client that collects what the server pushes."""

    def __init__(self, connection: websockets.ClientConnection) -> None:
        self.connection = connection
        self.received: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(message))

    async def expect(
        self, match: Callable[[dict[str, Any]], bool], within: float = 10.0
    ) -> dict[str, Any]:
        for message in self.received:
            if match(message):
                return message
        async with asyncio.timeout(within):
            while True:
                message = json.loads(await self.connection.recv())
                self.received.append(message)
                if match(message):
                    return message

    async def sync(self) -> None:
        """A ping answered means every op sent before it has been handled."""
        await self.send({"op": "ping"})
        await self.expect(lambda m: m["type"] == "pong")


async def open_socket(stack: Stack, token: str) -> Socket:
    connection = await websockets.connect(f"{stack.ws}?token={token}")
    socket = Socket(connection)
    await socket.sync()
    return socket
