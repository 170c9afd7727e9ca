"""Load generation with wrk (and its Lua scripts in ``bench/wrk``), and the two baselines: a bare
uvicorn endpoint under the same load, and a bare Redis write loop."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench import bare, cpu
from shared.settings import child_environment

WRK_DIR = Path(__file__).resolve().parent / "wrk"


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    non2xx: int
    socket_errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def wrk(
    url: str,
    script: str,
    *,
    seconds: float,
    connections: int = 64,
    threads: int = 2,
    rate: float = 0.0,
    env: dict[str, str] | None = None,
) -> WrkResult:
    """One wrk run; ``rate`` > 0 holds the whole run near that many requests a second."""
    environment = child_environment(
        {"BENCH_RATE": str(rate), "BENCH_CONNECTIONS": str(connections), **(env or {})}
    )
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(WRK_DIR / script),
        url,
    ]
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=seconds + 60, check=True
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("BENCH-JSON "))
    data = json.loads(line.removeprefix("BENCH-JSON "))
    return WrkResult(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        non2xx=data["non2xx"],
        socket_errors=data["connect_errors"]
        + data["read_errors"]
        + data["write_errors"]
        + data["timeouts"],
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        max_ms=data["max_us"] / 1000,
    )


def reads(url: str, paths: str, *, seconds: float) -> WrkResult:
    """GETs of ``paths`` (separated by spaces) at 500 requests a second on 4 connections, for
    half a load phase but at least 5 s: how a read is measured, and its baseline on the bare
    endpoint."""
    return wrk(
        url,
        "get.lua",
        seconds=max(5.0, seconds / 2),
        connections=4,
        rate=500,
        env={"BENCH_PATHS": paths},
    )


def wrk_version() -> str:
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).splitlines()[0].strip()


class BareServer:
    """The bare endpoint (:mod:`bench.bare`) in its own process(es), on ``port``."""

    def __init__(self, port: int, workers: int) -> None:
        self.port = port
        self.workers = workers
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BareServer:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.bare", str(self.port), str(self.workers)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if bare.answers(self.port):
                return self
            time.sleep(0.1)
        raise RuntimeError("the bare endpoint did not start")

    def __exit__(self, *_: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=20)


# The baseline write: what a minimal weekly-leaderboard write does in Redis, as one function.
BASELINE_LIBRARY = "ladder_bench_baseline"
BASELINE_SOURCE = f"""#!lua name={BASELINE_LIBRARY}
redis.register_function('ladder_bench_submit', function(keys, args)
  redis.call('ZADD', keys[1], 'GT', args[1], args[2])
  local rank = redis.call('ZREVRANK', keys[1], args[2])
  redis.call('PFADD', keys[2], args[2])
  redis.call('XADD', keys[3], 'MAXLEN', '~', '10000', '*', 'u', args[2], 's', args[1])
  return rank
end)
"""


@dataclass(frozen=True)
class LoopResult:
    """The bare loop's submissions a second, and the CPU seconds each group of processes
    (bench/cpu.py) spent over the same counted seconds."""

    rate: float
    submissions: int
    cpu: dict[str, float]

    def cpu_per_submission(self, group: str) -> float:
        """µs of ``group``'s CPU a submission."""
        return self.cpu.get(group, 0.0) / max(1, self.submissions) * 1e6


def redis_loop(url: str, prefix: str, *, seconds: float, threads: int = 8) -> LoopResult:
    """The bare loop: ``threads`` threads of sync redis-py, each submission one FCALL (ZADD GT,
    ZREVRANK, PFADD, XADD) and two ``EXPIRE NX``; its rate and the CPU it took, Redis's and its
    own (the bench's process), which say how fast the machine ran in this run."""
    client = redis.Redis.from_url(url)
    client.function_load(BASELINE_SOURCE, replace=True)
    tag = "{" + prefix + ":baseline}"
    board, players, stream = f"{tag}:board", f"{tag}:players", f"{tag}:stream"
    counts = [0] * threads
    stop = threading.Event()

    def work(n: int) -> None:
        connection = redis.Redis.from_url(url)
        i = 0
        while not stop.is_set():
            i += 1
            member = f"u{n}-{i % 50_000}"
            connection.fcall("ladder_bench_submit", 3, board, players, stream, i, member)
            connection.expire(board, 7 * 86_400, nx=True)
            connection.expire(players, 7 * 86_400, nx=True)
            counts[n] += 1
        connection.close()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    try:
        for worker in workers:
            worker.start()
        time.sleep(1.0)  # warm-up, not counted
        before, started, cpu_before = sum(counts), time.monotonic(), cpu.snapshot()
        time.sleep(seconds)
        done, elapsed = sum(counts) - before, time.monotonic() - started
        used = cpu.spent(cpu_before, cpu.snapshot())
    finally:
        stop.set()
        for worker in workers:
            worker.join()
        client.unlink(board, players, stream)
        client.function_delete(BASELINE_LIBRARY)
        client.close()
    return LoopResult(done / elapsed, done, used)
