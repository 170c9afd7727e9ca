"""Single score POSTs against one API process, before and after a change: ``python
scripts/probe_single_posts.py [--redis HOST:PORT] [--api-port N] [LADDER_X=value ...]`` from a
checkout, with a private redis-server (default 127.0.0.1:6394) that nothing else uses.

It starts the checkout's API (one uvicorn process, the broker away so the relay idles) on a
private port, posts single scores from raw HTTP/1.1 keep-alive connections (far cheaper than the
API, so they do not bound it), first one at a time, then from 64 at once, and prints per event:
the API process's CPU and the Redis server's (from ``/proc``), Redis read events (its round
trips) and commands (``INFO stats``), events a second and latency percentiles. Not ``make
bench``: a micro-measurement for before/after ratios on a shared machine (docs/architecture.md,
"Performance").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid

import redis

PREFIX = "probe" + uuid.uuid4().hex[:6]
# Set from the command line by main().
API_PORT = 18694
REDIS_URL = "redis://127.0.0.1:6394/2"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def post_all(clients: int, each: int) -> list[float]:
    """``clients`` connections posting ``each`` scores one after another; every latency."""
    latencies: list[float] = []
    tag = uuid.uuid4().hex[:6]

    async def client(c: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", API_PORT)
        for i in range(each):
            body = f'{{"user_id":"u-{tag}-{c}-{i}","region":"r{c % 4}","value":{i + 1}}}'
            request = (
                "POST /v1/boards/main/scores HTTP/1.1\r\nHost: probe\r\n"
                "Authorization: Bearer dev-server-key\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            answer = await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError((head + answer).decode())
        writer.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return latencies


def wait_ready() -> None:
    for _ in range(150):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{API_PORT}/healthz") as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the API did not start")


def measure(api: subprocess.Popen[bytes], client: redis.Redis, clients: int, each: int) -> str:
    redis_pid = client.info("server")["process_id"]
    before = client.info("stats")
    api_cpu, redis_cpu = cpu_seconds(api.pid), cpu_seconds(redis_pid)
    started = time.perf_counter()
    latencies = sorted(asyncio.run(post_all(clients, each)))
    wall = time.perf_counter() - started
    api_cpu, redis_cpu = cpu_seconds(api.pid) - api_cpu, cpu_seconds(redis_pid) - redis_cpu
    after = client.info("stats")
    n = clients * each
    reads = after["total_reads_processed"] - before["total_reads_processed"]
    commands = after["total_commands_processed"] - before["total_commands_processed"]
    return (
        f"{clients:2d} clients, {n} events: API CPU {api_cpu / n * 1e6:4.0f} µs, Redis CPU "
        f"{redis_cpu / n * 1e6:4.0f} µs, Redis reads {reads / n:.3f}, commands "
        f"{commands / n:.1f} an event; {n / wall:5.0f} events/s, p50 "
        f"{statistics.median(latencies) * 1e3:.2f} ms, p99 "
        f"{latencies[int(0.99 * len(latencies))] * 1e3:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="127.0.0.1:6394", help="a private redis-server")
    parser.add_argument("--api-port", type=int, default=18694)
    parser.add_argument("settings", nargs="*", help="LADDER_X=value, for the API process")
    options = parser.parse_args()
    global REDIS_URL, API_PORT
    REDIS_URL, API_PORT = f"redis://{options.redis}/2", options.api_port
    overrides = {
        "LADDER_REDIS_URL": REDIS_URL,
        "LADDER_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/",
        "LADDER_API_PORT": str(API_PORT),
        "LADDER_API_WORKERS": "1",
        "LADDER_KEY_PREFIX": PREFIX,
        "LADDER_KEY_RATE": "1000000",
        "LADDER_LOG_LEVEL": "ERROR",
    }
    overrides.update(arg.partition("=")[::2] for arg in options.settings)
    # env(1) adds the settings to what the API inherits: the probe reads no environment itself.
    api = subprocess.Popen(
        ["env", *(f"{k}={v}" for k, v in overrides.items()), sys.executable, "-m", "services.api"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis.from_url(REDIS_URL)
    try:
        wait_ready()
        asyncio.run(post_all(8, 50))  # connections, caches and the pool warmed
        for clients, each in ((1, 400), (64, 60), (64, 60), (64, 60)):
            time.sleep(0.5)
            print(measure(api, client, clients, each), flush=True)
    finally:
        api.terminate()
        api.wait()
        found = list(client.scan_iter(match=f"*{PREFIX}*", count=1000))
        for start in range(0, len(found), 1000):
            client.delete(*found[start : start + 1000])


if __name__ == "__main__":
    main()
