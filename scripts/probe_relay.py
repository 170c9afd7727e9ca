"""Single score POSTs through a private Ladder, before and after a change to the relay: ``python
scripts/probe_relay.py [--redis HOST:PORT] [--seconds N] [--push N] [LADDER_X=value ...]`` from a
checkout, with a private redis-server (default 127.0.0.1:6394) that nothing else uses.

It starts the checkout's four services (tests/stack.py: its own key and broker prefixes, its own
MySQL database, free ports; the shared RabbitMQ and MariaDB), loads board ``main`` with wrk
(``bench/wrk/post.lua``, 64 connections) after a warm-up, waits until every consumer has handled
every accepted event, and prints: events a broker message (the relay's own counters), events a
second through every consumer, and the CPU an event of each of the stack's own processes (from
``/proc``: the API's workers, each consumer, its redis-server; RabbitMQ and MariaDB are shared
with whatever else runs, so they are left out). With ``--push N`` it then times N POSTs to the
WebSocket push each causes on the idle stack. Not ``make bench``: a micro-measurement for
before/after ratios on a shared machine (docs/architecture.md, "Performance").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import load
from bench.probes import Ladder, percentile, push_latency
from services.history.migrate import migrate
from shared.amqp import connect as connect_broker
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.stack import SERVICES, Stack

MYSQL_SERVER = "mysql+asyncmy://root@127.0.0.1:3306"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
KEY = "dev-server-key"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """A process and its descendants (the API's worker processes)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def processes(stack: Stack, redis_pid: int) -> dict[str, list[int]]:
    groups = {"Redis": [redis_pid]}
    for service in SERVICES:
        pid = int(stack.ctl("pid", service).strip())
        groups[service] = tree(pid)
    return groups


def cpu_of(groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(p) for p in pids) for name, pids in groups.items()}


async def drained(ladder: Ladder, board: str, accepted: int, consumed: dict[str, float]) -> float:
    """Wait until the outbox is empty and every consumer handled ``accepted`` more events."""
    end = time.monotonic() + 180
    while time.monotonic() < end:
        now = await ladder.consumed()
        backlog = await ladder.redis.xlen(ladder.keys.outbox(board))
        if backlog == 0 and all(now[c] - consumed[c] >= accepted for c in consumed):
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise TimeoutError("the consumers did not drain")


async def measure(stack: Stack, ladder: Ladder, redis_pid: int, seconds: float) -> str:
    board, groups = "main", processes(stack, redis_pid)
    env = {"BENCH_BOARD": board, "BENCH_KEY": KEY}
    # Warm-up: connections, caches, the consumers' first batches; then a drained, idle stack.
    before = await ladder.settled(board)
    consumed = await ladder.consumed()
    load.wrk(ladder.api, "post.lua", seconds=3, env=env | {"BENCH_RUN": uuid.uuid4().hex[:8]})
    warm = await ladder.settled(board)
    await drained(ladder, board, warm - before, consumed)
    consumed, (events0, messages0) = await ladder.consumed(), await ladder.relayed()
    cpu0, started = cpu_of(groups), time.monotonic()
    run = await asyncio.to_thread(
        load.wrk,
        ladder.api,
        "post.lua",
        seconds=seconds,
        env=env | {"BENCH_RUN": uuid.uuid4().hex[:8]},
    )
    accepted = await ladder.settled(board) - warm
    done = await drained(ladder, board, accepted, consumed)
    cpu1, (events1, messages1) = cpu_of(groups), await ladder.relayed()
    spent = {name: (cpu1[name] - cpu0[name]) / accepted * 1e6 for name in groups}
    per_message = (events1 - events0) / max(messages1 - messages0, 1)
    return (
        f"{accepted} events ({run.non2xx} non-2xx): accepted {accepted / run.seconds:,.0f}/s, "
        f"through every consumer {accepted / (done - started):,.0f}/s, "
        f"{per_message:.1f} events a message ({messages1 - messages0:.0f} messages); CPU an "
        "event: " + ", ".join(f"{name} {us:,.0f} µs" for name, us in spent.items())
    )


async def push(ladder: Ladder, samples: int) -> str:
    await ladder.define("bench-ws", notify_top=[1, 10, 100])
    await asyncio.sleep(0.5)
    latencies, missed = await push_latency(ladder, samples)
    return (
        f"POST -> push, {samples} samples on the idle stack: p50 "
        f"{statistics.median(latencies):.1f} ms, p95 {percentile(latencies, 95):.1f} ms, "
        f"missed {missed}"
    )


async def run(options: argparse.Namespace) -> None:
    probe = "c" + uuid.uuid4().hex[:10]
    settings = LadderSettings(
        _env_file=None,  # type: ignore[call-arg]
        env="dev",
        redis_url=f"redis://{options.redis}/3",
        amqp_url=AMQP_URL,
        mysql_url=f"{MYSQL_SERVER}/ladder_{probe}",
        key_prefix=f"lp-{probe}",
        broker_prefix=f"lp-{probe}",
    )
    await migrate(settings.mysql_url)
    overrides = dict(arg.partition("=")[::2] for arg in options.settings)
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(settings, Path(tmp) / "run", extra_env={"LADDER_KEY_RATE": "1000000"})
        stack.extra_env.update(overrides)
        stack.start()
        try:
            ported = settings.model_copy(update={f"{s}_port": stack.ports[s] for s in SERVICES})
            async with (
                open_redis(settings.redis_url, cluster=settings.redis_cluster) as redis,
                httpx.AsyncClient(timeout=30) as http,
            ):
                ladder = Ladder(ported, redis, http, KEY, "dev-admin-key")
                redis_pid = int((await redis.info("server"))["process_id"])
                for _ in range(options.rounds):
                    print(await measure(stack, ladder, redis_pid, options.seconds), flush=True)
                if options.push:
                    print(await push(ladder, options.push), flush=True)
        finally:
            stack.shutdown()
            async with open_redis(settings.redis_url, cluster=settings.redis_cluster) as redis:
                for pattern in (f"{settings.key_prefix}:*", "{" + settings.key_prefix + ":*"):
                    found = [k async for k in redis.scan_iter(match=pattern, count=1000)]
                    for start in range(0, len(found), 1000):
                        await redis.delete(*found[start : start + 1000])
            topology = Topology(settings.broker_prefix, settings.delivery_limit)
            connection = await connect_broker(settings.amqp_urls)
            async with connection:
                await topology.delete(await connection.channel())
            await asyncio.to_thread(
                subprocess.run,
                ["mysql", "-h", "127.0.0.1", "-u", "root", "-e", f"DROP DATABASE ladder_{probe}"],
                check=False,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="127.0.0.1:6394", help="a private redis-server")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--push", type=int, default=0, help="POST -> push samples")
    parser.add_argument("settings", nargs="*", help="LADDER_X=value, for the services")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
