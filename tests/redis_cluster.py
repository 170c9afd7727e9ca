"""A private Redis Cluster on loopback for the tests: three primaries and three replicas of the
installed ``redis-server`` on free ports (each with its bus port, the port plus 10000), made
one cluster by ``redis-cli --cluster create``; every process is killed and its directory removed
at the end."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import redis

from bench.ports import consecutive_free
from tests.stack import wait_for

HOST = "127.0.0.1"
BUS_OFFSET = 10_000
# Ports of a private cluster: clear of 6379, of `make cluster-up`'s 7000-7005 and, with their
# bus ports (10000 above), of the kernel's ephemeral range (32768 and up by default).
LOW, HIGH = 12_000, 22_000


def free_cluster_ports(count: int) -> list[int]:
    """``count`` consecutive ports, each free with its bus port."""
    return consecutive_free(count, LOW, HIGH, also=[BUS_OFFSET])


class PrivateCluster:
    """Six ``redis-server`` processes in cluster mode: ``ports[:3]`` start as primaries."""

    def __init__(self, ports: list[int] | None = None) -> None:
        self.ports = ports or free_cluster_ports(6)
        self.root = Path(tempfile.mkdtemp(prefix="ladder-cluster-"))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.ports[0]}/0"

    def start(self) -> PrivateCluster:
        for port in self.ports:
            self.start_node(port)
        for port in self.ports:
            wait_for(f"redis-server on {port}", lambda p=port: self.answers(p), 60, 0.2)
        nodes = [f"{HOST}:{port}" for port in self.ports]
        replicas = ["--cluster-replicas", "1", "--cluster-yes"]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, *replicas],
            check=True,
            capture_output=True,
            timeout=60,
        )
        what = "the cluster to be ok with three primaries and three replicas"
        wait_for(what, self.healthy, 60, 0.2)
        return self

    def start_node(self, port: int) -> None:
        folder = self.root / str(port)
        folder.mkdir(exist_ok=True)
        cluster = ["--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf")]
        # Two seconds without an answer and a primary is failed over by its replica.
        cluster += ["--cluster-node-timeout", "2000"]
        plain = ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        plain += ["--logfile", str(folder / "redis.log")]
        self.processes[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", HOST, *cluster, *plain],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host=HOST, port=port, socket_timeout=2, decode_responses=True)

    def answers(self, port: int) -> bool:
        try:
            with self.client(port) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def roles(self) -> dict[int, str]:
        """Each live node's role as it says itself: ``master`` or ``slave``."""
        roles = {}
        for port, process in self.processes.items():
            if process.poll() is not None:
                continue
            try:
                with self.client(port) as client:
                    roles[port] = str(client.execute_command("ROLE")[0])
            except redis.RedisError:
                continue
        return roles

    def primaries(self) -> list[int]:
        return sorted(port for port, role in self.roles().items() if role == "master")

    def healthy(self) -> bool:
        roles = self.roles()
        if sorted(roles.values()).count("master") != 3 or len(roles) != len(self.processes):
            return False
        for port, role in roles.items():
            with self.client(port) as client:
                if client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
                # A replica that has not synced once cannot take its primary's place.
                if role == "slave" and client.info("replication")["master_link_status"] != "up":
                    return False
        return True

    def port_of_slot(self, slot: int) -> int:
        with self.client(self.primaries()[0]) as client:
            for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(primary[1])
        raise LookupError(slot)

    def node_id(self, port: int) -> str:
        with self.client(port) as client:
            return str(client.execute_command("CLUSTER MYID"))

    def kill(self, port: int) -> None:
        self.processes[port].send_signal(signal.SIGKILL)
        self.processes[port].wait(10)

    def remove(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
