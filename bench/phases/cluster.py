"""One Redis primary against a Redis Cluster of three, and the cost of ``WAIT``, on private
servers of the phase's own: single-event POSTs and batch ingest through an API process of its
own, its Redis

- one primary with one replica, then
- a cluster of three primaries with a replica each,

each without and with ``LADDER_REDIS_WAIT_REPLICAS=1``; every run a load phase of the bench's
length, spread over six boards (two on each of the cluster's primaries). The ratios are to the
one primary without ``WAIT``, measured in the same run; each Redis node's CPU time over every
run is read from ``/proc`` (the per-shard shares).

The API's broker is unreachable on purpose: accepted events stay in the outbox (its bound
raised), so the figures are the write path's alone, the same in all four configurations.

``python -m bench.phases.cluster`` runs it alone (under ``flock /tmp/ladder-load.lock`` on a
shared machine); ``make bench`` runs it with the other phases.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from redis.asyncio import Redis
from redis.crc import key_slot

from bench import load
from bench.cpu import TICKS
from bench.phases.staleness import spawn, wait_ready
from bench.ports import consecutive_free
from bench.report import Line, Note, Row
from bench.settings import BenchSettings
from shared.boards import Board
from shared.keys import Keys
from shared.settings import DEV_SERVER_KEY, child_environment, load_settings

PREFIX = "ladder-bench-cluster"
UNREACHABLE_BROKER = "amqp://guest:guest@127.0.0.1:1/"
BOARDS_PER_PRIMARY = 2
# Ports of the private servers, each with its cluster bus port (10000 above): clear of 6379,
# of `make cluster-up`'s 7000-7005 and of the kernel's ephemeral ports (32768 and up).
LOW, HIGH, BUS = 12_000, 22_000, 10_000
CREATE = ["--cluster-replicas", "1", "--cluster-yes"]


def free_ports(count: int) -> list[int]:
    return consecutive_free(count, LOW, HIGH, also=[BUS])


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Servers:
    """Private ``redis-server`` processes: ``primaries`` first, then their replicas."""

    primaries: list[int]
    replicas: list[int]
    cluster: bool
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ladder-bench-")))
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primaries[0]}/0"

    def start(self) -> None:
        for i, port in enumerate(self.primaries + self.replicas):
            folder = self.folder / str(port)
            folder.mkdir()
            options = ["--save", "", "--appendonly", "no", "--dir", str(folder)]
            if self.cluster:
                options += ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]
                options += ["--cluster-config-file", str(folder / "nodes.conf")]
            elif i >= len(self.primaries):
                options += ["--replicaof", "127.0.0.1", str(self.primaries[0])]
            self.processes[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", *options],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        for port in self.processes:
            self._wait(lambda p=port: self._answers(p), f"redis-server on {port}")
        if self.cluster:
            nodes = [f"127.0.0.1:{p}" for p in self.primaries + self.replicas]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *nodes, *CREATE],
                check=True,
                capture_output=True,
                timeout=60,
            )
        self._wait(self._linked, "every replica in sync with its primary")

    def _command(self, port: int, *args: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout

    def _answers(self, port: int) -> bool:
        return self._command(port, "PING").strip() == "PONG"

    def _linked(self) -> bool:
        if self.cluster and "cluster_state:ok" not in self._command(
            self.primaries[0], "CLUSTER", "INFO"
        ):
            return False
        return all(
            "master_link_status:up" in self._command(port, "INFO", "replication")
            for port in self.replicas
        )

    def flush(self) -> None:
        for port in self.primaries:
            self._command(port, "FLUSHALL")
        self._wait(
            lambda: all(self._command(p, "DBSIZE").strip() == "0" for p in self.replicas),
            "replicas flushed",
        )

    def primary_of(self, key: str) -> int:
        """The primary serving ``key``'s slot."""
        if not self.cluster:
            return self.primaries[0]
        slot = key_slot(key.encode())
        lines = self._command(self.primaries[0], "CLUSTER", "NODES").splitlines()
        for line in lines:
            parts = line.split()
            if "master" not in parts[2]:
                continue
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            for span in parts[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return port
        raise LookupError(key)

    def cpu(self) -> dict[int, float]:
        return {port: cpu_seconds(p.pid) for port, p in self.processes.items()}

    @staticmethod
    def _wait(check: object, what: str, within: float = 60.0) -> None:
        end = time.monotonic() + within
        while time.monotonic() < end:
            if check():  # type: ignore[operator]
                return
            time.sleep(0.1)
        raise TimeoutError(f"{what}: not within {within:.0f} s")

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            process.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


@asynccontextmanager
async def servers(cluster: bool) -> AsyncIterator[Servers]:
    count = 3 if cluster else 1
    ports = free_ports(2 * count)
    running = Servers(ports[:count], ports[count:], cluster)
    try:
        await asyncio.to_thread(running.start)
        yield running
    finally:
        await asyncio.to_thread(running.stop)


def spread_boards(running: Servers, keys: Keys) -> list[str]:
    """Board ids, ``BOARDS_PER_PRIMARY`` on each primary of the cluster (their hash tags' slots),
    the same ids whatever the servers."""
    found: dict[int, list[str]] = {}
    for i in range(1000):
        board_id = f"bc-{i}"
        node = running.primary_of(keys.tag(board_id))
        if len(found.setdefault(node, [])) < BOARDS_PER_PRIMARY:
            found[node].append(board_id)
        if sum(len(ids) for ids in found.values()) == BOARDS_PER_PRIMARY * len(running.primaries):
            break
    return sorted(board_id for ids in found.values() for board_id in ids)


@dataclass(frozen=True)
class Measured:
    rate: float  # events accepted a second
    refused: int  # requests answered other than 2xx
    cpu: dict[int, float]  # each node's CPU seconds over the run


async def run_api(
    running: Servers, boards: Sequence[str], replicas: int, seconds: float
) -> tuple[Measured, Measured]:
    """The API on ``running`` with ``WAIT replicas``: single POSTs, then batches."""
    await asyncio.to_thread(running.flush)
    keys = Keys(PREFIX)
    # Where the catalog reads them: the definitions' hash, on the primary of its slot.
    node = running.primary_of(keys.boards)
    async with Redis.from_url(f"redis://127.0.0.1:{node}/0") as client:
        for board_id in boards:
            await client.hset(keys.boards, board_id, Board(board_id=board_id).model_dump_json())
    settings = load_settings()
    port = free_ports(1)[0]
    env = child_environment(
        dict(
            LADDER_ENV="dev",
            LADDER_KEY_PREFIX=PREFIX,
            LADDER_BROKER_PREFIX=PREFIX,
            LADDER_AMQP_URL=UNREACHABLE_BROKER,
            LADDER_MYSQL_URL=settings.mysql_url,
            LADDER_REDIS_URL=running.url,
            LADDER_REDIS_CLUSTER="true" if running.cluster else "false",
            LADDER_REDIS_WAIT_REPLICAS=str(replicas),
            LADDER_API_PORT=str(port),
            LADDER_API_WORKERS=str(settings.api_workers),
            LADDER_KEY_RATE="100000000",
            LADDER_OUTBOX_MAX="100000000",
            LADDER_LOG_LEVEL="WARNING",
        )
    )
    api = spawn("api", env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            await wait_ready(http, url)
        single = await _measure(running, url, boards, "post.lua", 64, 1, seconds)
        batch = await _measure(running, url, boards, "batch.lua", 4, 500, seconds)
    finally:
        api.terminate()
        await asyncio.to_thread(api.wait, 30)
    return single, batch


async def _measure(
    running: Servers,
    url: str,
    boards: Sequence[str],
    script: str,
    connections: int,
    per_request: int,
    seconds: float,
) -> Measured:
    env = {
        "BENCH_BOARDS": " ".join(boards),
        "BENCH_KEY": DEV_SERVER_KEY,
        "BENCH_BATCH": str(per_request),
    }
    warm = env | {"BENCH_RUN": "w" + uuid.uuid4().hex[:6]}
    await asyncio.to_thread(load.wrk, url, script, seconds=3, connections=connections, env=warm)
    before = running.cpu()
    result = await asyncio.to_thread(
        load.wrk,
        url,
        script,
        seconds=seconds,
        connections=connections,
        env=env | {"BENCH_RUN": "m" + uuid.uuid4().hex[:6]},
    )
    after = running.cpu()
    accepted = (result.requests - result.non2xx) * per_request / result.seconds
    spent = {port: after[port] - before[port] for port in after}
    return Measured(accepted, result.non2xx + result.socket_errors, spent)


def shares(running: Servers, measured: Measured, seconds: float) -> str:
    """Each primary's CPU (share of all Redis CPU, and cores), then the replicas'."""
    total = sum(measured.cpu.values()) or 1.0
    parts = [
        f"{measured.cpu[p] / total:.0%} ({measured.cpu[p] / seconds:.2f} core)"
        for p in running.primaries
    ]
    copies = sum(measured.cpu[p] for p in running.replicas)
    return ", ".join(parts) + f"; replicas {copies / total:.0%}"


async def measure(seconds: float) -> list[Line]:
    """The rows: each configuration's throughput as a ratio to one primary without WAIT."""
    found: dict[tuple[str, int], tuple[Measured, Measured]] = {}
    places: dict[str, Servers] = {}
    lines: list[Line] = []
    keys = Keys(PREFIX)
    boards: list[str] = []
    for cluster in (True, False):  # the cluster first: it places the boards
        name = "3 primaries" if cluster else "1 primary"
        async with servers(cluster) as running:
            if cluster:
                boards = spread_boards(running, keys)
            places[name] = running
            for replicas in (0, 1):
                found[(name, replicas)] = await run_api(running, boards, replicas, seconds)
    base_single, base_batch = found[("1 primary", 0)]
    order = sorted(found, key=lambda config: (config[0] != "1 primary", config[1]))
    for name, replicas in order:
        single, batch = found[(name, replicas)]
        wait = "WAIT 1" if replicas else "no WAIT"
        lines += [
            Row(
                f"{name} (1 replica each), {wait}: single POST, accepted",
                f"{single.rate:,.0f} /s",
                f"{single.rate / base_single.rate:.2f} P",
            ),
            Row(
                "  … batch ingest (500 a request, 4 connections), accepted",
                f"{batch.rate:,.0f} ev/s",
                f"{batch.rate / base_batch.rate:.2f} P",
            ),
        ]
        if replicas:
            without_single, without_batch = found[(name, 0)]
            lines.append(
                Row(
                    f"  … cost of WAIT 1 on {name}: single, batch (with / without)",
                    f"{single.rate / without_single.rate:.2f}, "
                    f"{batch.rate / without_batch.rate:.2f}",
                )
            )
        lines.append(
            Row(
                "  … Redis CPU by primary under batch ingest",
                shares(places[name], batch, seconds),
            )
        )
        refused = single.refused + batch.refused
        if refused:
            lines.append(Note(f"{name}, {wait}: {refused} requests answered other than 2xx."))
    return lines


def main() -> int:
    options = BenchSettings()
    print(
        "P: one Redis primary with a replica, no WAIT, in this run; "
        f"phases of {options.seconds:.0f} s"
    )
    for line in asyncio.run(measure(options.seconds)):
        if isinstance(line, Note):
            print(f"note: {line.text}")
        else:
            print(f"  {line.figure:<66} {line.value:>34} {line.ratio:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
