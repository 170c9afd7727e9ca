"""A private RabbitMQ cluster on loopback for the tests: three nodes of the installed
``rabbitmq-server`` beside the system one, each with its own AMQP port, distribution port,
config file and data directory (owned by the ``rabbitmq`` user, as the server runs as it), made
one cluster with ``rabbitmqctl join_cluster``. Every node is stopped and its directory removed
at the end.

Node names carry the node's AMQP port (``ladder-test-rabbit-<port>@localhost``), so they never
clash with the system node (``rabbit@localhost``), with ``make cluster-up``'s nodes or with a
second run beside this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.ports import consecutive_free
from tests.stack import wait_for

HOST = "127.0.0.1"
# AMQP and distribution ports of a private cluster: clear of 5672-5675 and 25672-25675 (the
# system node and `make cluster-up`), of 7000-7005 and their bus ports, of the Redis tests'
# 12000-22000 (tests/redis_cluster.py) and of the kernel's ephemeral range (32768 and up).
LOW, HIGH = 26_000, 32_000
RESERVED = {*range(25_672, 25_676), *range(15_672, 15_676)}
RABBITMQ_USER = "rabbitmq"


def free_ports(count: int) -> list[int]:
    """``count`` consecutive free ports in the private range."""
    return consecutive_free(count, LOW, HIGH, reserved=RESERVED)


@dataclass(frozen=True)
class QuorumQueue:
    members: list[str]
    leader: str


class RabbitCluster:
    """Three RabbitMQ nodes clustered; ``nodes[0]`` is the one the others joined."""

    def __init__(self, size: int = 3) -> None:
        ports = free_ports(2 * size)
        self.amqp_ports = ports[:size]
        self.dist_ports = ports[size:]
        self.root = Path(tempfile.mkdtemp(prefix="ladder-rabbit-"))
        self.started: list[str] = []
        user = pwd.getpwnam(RABBITMQ_USER)
        self._uid, self._gid = user.pw_uid, user.pw_gid
        self._chown(self.root)

    def node(self, index: int) -> str:
        return f"ladder-test-rabbit-{self.amqp_ports[index]}@localhost"

    @property
    def nodes(self) -> list[str]:
        return [self.node(i) for i in range(len(self.amqp_ports))]

    def url(self, index: int) -> str:
        return f"amqp://guest:guest@{HOST}:{self.amqp_ports[index]}/"

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in range(len(self.amqp_ports))]

    @property
    def amqp_url(self) -> str:
        """``LADDER_AMQP_URL`` naming every node."""
        return ",".join(self.urls)

    def index_of_port(self, port: int) -> int:
        return self.amqp_ports.index(port)

    def _chown(self, path: Path) -> None:
        os.chown(path, self._uid, self._gid)

    def _environment(self, index: int) -> dict[str, str]:
        folder = self.root / str(self.amqp_ports[index])
        for sub in ("", "mnesia", "log"):
            (folder / sub).mkdir(exist_ok=True)
            self._chown(folder / sub)
        config = folder / "rabbitmq.conf"
        # The guest user may connect over loopback only: which is all these nodes listen on.
        config.write_text(f"listeners.tcp.local = {HOST}:{self.amqp_ports[index]}\n")
        plugins = folder / "enabled_plugins"
        plugins.write_text("[].\n")
        for path in (config, plugins):
            self._chown(path)
        return {
            **os.environ,
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq"),
            "RABBITMQ_NODENAME": self.node(index),
            "RABBITMQ_NODE_PORT": str(self.amqp_ports[index]),
            "RABBITMQ_DIST_PORT": str(self.dist_ports[index]),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_PID_FILE": str(folder / "rabbitmq.pid"),
        }

    def ctl(self, index: int, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl -n NODE args…``; its output."""
        done = subprocess.run(
            ["rabbitmqctl", "-q", "-n", self.node(index), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl -n {self.node(index)} {' '.join(args)}: {done.stderr.strip()}"
            )
        return done.stdout

    def start_node(self, index: int) -> None:
        subprocess.run(
            ["rabbitmq-server", "-detached"],
            env=self._environment(index),
            check=True,
            capture_output=True,
            timeout=60,
        )
        if self.node(index) not in self.started:
            self.started.append(self.node(index))
        self.ctl(
            index,
            "wait",
            str(self.root / str(self.amqp_ports[index]) / "rabbitmq.pid"),
            "--timeout",
            "90",
            timeout=120,
        )

    def start(self) -> RabbitCluster:
        try:
            for index in range(len(self.amqp_ports)):
                self.start_node(index)
            for index in range(1, len(self.amqp_ports)):
                self.ctl(index, "stop_app")
                self.ctl(index, "join_cluster", self.node(0))
                self.ctl(index, "start_app")
            wait_for("three running nodes in one cluster", self.formed, 90, 0.5)
        except BaseException:
            self.remove()
            raise
        return self

    def running_nodes(self, index: int = 0) -> list[str]:
        """The cluster's running nodes as ``nodes[index]`` sees them."""
        try:
            out = self.ctl(index, "eval", "rabbit_nodes:all_running().", timeout=20)
        except (RuntimeError, subprocess.TimeoutExpired):
            return []
        return sorted(n.strip(" '\n") for n in out.strip().strip("[]").split(",") if n.strip())

    def formed(self) -> bool:
        return self.running_nodes(0) == sorted(self.nodes)

    def stop_node(self, index: int) -> None:
        """Stop one node (its Erlang VM ends; the others carry on)."""
        self.ctl(index, "stop", timeout=90)

    def quorum_queues(self, index: int, vhost: str = "/") -> dict[str, QuorumQueue]:
        """Each quorum queue's members and leader, as ``nodes[index]`` lists them."""
        out = self.ctl(
            index, "list_queues", "-p", vhost, "name", "members", "leader", "--formatter", "json"
        )
        return {
            row["name"]: QuorumQueue(sorted(row["members"]), str(row["leader"]))
            for row in json.loads(out)
        }

    def connections(self, index: int) -> list[tuple[str, int]]:
        """Every client connection of the cluster, as ``nodes[index]`` lists them: the name
        the client gave it and the AMQP port it came in on, which tells the node holding it."""
        out = self.ctl(
            index, "list_connections", "client_properties", "port", "--formatter", "json"
        )
        held = []
        for row in json.loads(out):
            properties = {key: value for key, _, value in row["client_properties"]}
            held.append((str(properties.get("connection_name", "")), int(row["port"])))
        return held

    def remove(self) -> None:
        for index in range(len(self.amqp_ports)):
            if self.node(index) in self.started:
                try:
                    self.ctl(index, "stop", timeout=60)
                except (RuntimeError, subprocess.TimeoutExpired):
                    self._kill(index)
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill(self, index: int) -> None:
        pid_file = self.root / str(self.amqp_ports[index]) / "rabbitmq.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
