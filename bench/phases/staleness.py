"""The global view's staleness after a start with a merge backlog: a private stack
(a redis-server of its own, the API and the aggregator as processes, the shared broker under a
prefix of its own) starts on 200,000 dirty users of board ``main`` in each of its periods, as a
load run stopped before its merge drained leaves them; then a fresh score is posted every
quarter second. Measured from outside the aggregator:

- how long each fresh score takes to show in the global view with an ``as_of`` at or after its
  POST (the worst over the run is the global view's staleness), how long its entry alone takes
  to show there, and when the backlog is drained; one poller looks for every waiting score at
  once, so that the probe's load does not grow with the staleness it measures;
- whether the live views stay live meanwhile: the age of the hot view's ``as_of`` (the worst
  seen), and how long the ``leaderboard`` push of the fresh score's region takes to carry it
  (it enters that region's top 10).

``python -m bench.phases.staleness`` runs it alone (under ``flock /work/wt/load.lock`` on a
shared machine); ``make bench`` runs it with the other phases.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis

from bench.phases.commands import private_redis
from bench.probes import layout_entries
from bench.report import Line, Note, Row
from bench.settings import ROOT
from shared.amqp import connect as connect_broker
from shared.boards import MAIN_BOARD
from shared.keys import Keys, dirty_member
from shared.periods import window_at
from shared.settings import DEV_SERVER_KEY, child_environment, load_settings
from shared.topology import Topology

BACKLOG = 200_000
REGIONS = 8
TARGET = 5.0  # seconds, at most
# Fresh scores posted after the start, one every INTERVAL, until the backlog is drained and a
# few more have shown (the backlog watched for at most RUN_LIMIT seconds).
INTERVAL = 0.25
RUN_LIMIT = 180.0
# How often the waiting fresh scores are looked for in the global view.
POLL = 0.05
PREFIX = "ladder-stale"
SERVER = {"Authorization": f"Bearer {DEV_SERVER_KEY}"}


async def fill_backlog(redis: Redis, keys: Keys) -> None:
    """200,000 users of board main in 8 regions, each with an entry and a dirty mark in every
    period of the board, and its regions set, as the write and a stopped aggregator leave them."""
    rng = random.Random(9)
    board, now = MAIN_BOARD, datetime.now(UTC)
    windows = [window_at(p, now, board.timezone) for p in board.periods]
    step = 2000
    for start in range(0, BACKLOG, step):
        region = f"r{start // step % REGIONS}"
        ids = [f"b{i}" for i in range(start, start + step)]
        async with redis.pipeline(transaction=False) as pipe:
            for w in windows:
                mapping, records = layout_entries(rng, ids)
                view = keys.region_view(board.board_id, w.period, w.period_id, region)
                pipe.zadd(view, mapping)
                pipe.hset(Keys.ties(view), mapping=records)
                pipe.sadd(keys.regions(board.board_id, w.period, w.period_id), region)
                marks = [dirty_member(w.period, w.period_id, region, u) for u in ids]
                pipe.sadd(keys.dirty(board.board_id), *marks)
            pipe.hset(keys.user_regions(board.board_id), mapping=dict.fromkeys(ids, region))
            await pipe.execute()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spawn(service: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", f"services.{service}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_ready(http: httpx.AsyncClient, url: str, within: float = 60.0) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if (await http.get(f"{url}/readyz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {within} s")


class Run:
    """What the run saw: each fresh score's POST time and when it showed (globally, and in
    its region's push), the hot view's ages, when the backlog drained."""

    def __init__(self) -> None:
        self.posted: dict[str, float] = {}
        self.shown: dict[str, float] = {}
        self.entered: dict[str, float] = {}
        self.pushed: dict[str, float] = {}
        self.hot_ages: list[float] = []
        self.drained: float | None = None
        self.begun: float | None = None
        """When the first merge took the backlog (its merging set appeared), after the start."""
        self.redis_cpu = 0.0
        """Seconds of CPU the Redis spent from that take to the drain (``INFO cpu``)."""
        self.refused = 0
        self.waiting: dict[str, datetime] = {}
        """Fresh scores posted and not shown yet: user -> the time of its POST."""


async def post_fresh(http: httpx.AsyncClient, api: str, run: Run, stop: asyncio.Event) -> None:
    i = 0
    while not stop.is_set():
        user = f"fresh-{i}"
        # The board's largest value, above every backlog entry: the first ten fresh scores make
        # region eu's top 10 (ties rank the earlier first).
        body = {"user_id": user, "region": "eu", "value": MAIN_BOARD.max_value}
        run.posted[user] = time.monotonic()
        posted_at = datetime.now(UTC)
        response = await http.post(f"{api}/v1/boards/main/scores", json=body, headers=SERVER)
        if response.status_code == 503:  # the API not ready for writes yet: again shortly
            del run.posted[user]
            run.refused += 1
            await asyncio.sleep(INTERVAL)
            continue
        if response.status_code != 200:
            raise RuntimeError(f"POST {response.status_code}: {response.text}")
        run.waiting[user] = posted_at
        i += 1
        await asyncio.sleep(INTERVAL)


async def watch_global(
    http: httpx.AsyncClient, api: str, redis: Redis, keys: Keys, run: Run, stop: asyncio.Event
) -> None:
    """Every ``POLL`` seconds, until ``stop`` and no fresh score is left waiting: which waiting
    scores have a global entry (one ``HMGET`` of the global view's records), and the global
    view's ``as_of`` (one leaderboard read through the API); a score shows once it has its entry
    and the ``as_of`` is at or after its POST. The probe's own load stays the same however many
    scores wait: one call of each a poll (a poll of each waiting score would add load that grows
    with the staleness it measures, on the machine it measures)."""
    records = Keys.ties(keys.global_view(MAIN_BOARD.board_id, "alltime", "all"))
    query: dict[str, str | int] = {"scope": "global", "period": "alltime", "limit": 1}
    while not stop.is_set() or run.waiting:
        waiting = list(run.waiting)
        fresh = [u for u in waiting if u not in run.entered]
        if fresh:
            found = await redis.hmget(records, fresh)
            now = time.monotonic()
            for user, record in zip(fresh, found, strict=True):
                if record is not None:
                    run.entered[user] = now
        page = await http.get(f"{api}/v1/boards/main/leaderboard", params=query)
        as_of = page.json().get("as_of") if page.status_code == 200 else None
        if as_of:
            merged_by, now = datetime.fromisoformat(as_of), time.monotonic()
            for user in waiting:
                if user in run.entered and run.waiting[user] <= merged_by:
                    run.shown[user] = now
                    del run.waiting[user]
        await asyncio.sleep(POLL)


async def watch_hot(http: httpx.AsyncClient, api: str, run: Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        body = (await http.get(f"{api}/v1/boards/main/hot", params={"window": 60})).json()
        if body.get("as_of"):
            age = (datetime.now(UTC) - datetime.fromisoformat(body["as_of"])).total_seconds()
            run.hot_ages.append(age)
        await asyncio.sleep(0.25)


async def watch_pushes(redis: Redis, keys: Keys, run: Run, stop: asyncio.Event) -> None:
    """The region eu top-10 pushes (Redis Pub/Sub, as the API's hub hears them)."""
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(keys.board_channel("main", "region:eu", "alltime"))
        while not stop.is_set():
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if not message:
                continue
            body: dict[str, Any] = orjson.loads(message["data"])
            if body.get("period") != "alltime":
                continue
            for entry in body.get("entries", []):
                run.pushed.setdefault(entry["user_id"], time.monotonic())


async def watch_backlog(redis: Redis, keys: Keys, run: Run, started: float) -> None:
    """Until the merging set is drained and only the fresh scores' marks are dirty (at most
    ``RUN_LIMIT`` seconds; ``run.drained`` stays ``None`` past it); when the merge began (the
    aggregator's start-up, before it), and the CPU Redis spent on the drain."""
    cpu_at_take = 0.0
    while run.drained is None and time.monotonic() - started < RUN_LIMIT:
        merging = await redis.exists(keys.dirty_merging("main"))
        if merging and run.begun is None:
            run.begun = time.monotonic() - started
            cpu_at_take = await redis_cpu(redis)
        if not merging and run.begun is not None:
            marks = await redis.scard(keys.dirty("main"))
            if marks < 1000:  # only the fresh scores' marks left
                run.drained = time.monotonic() - started
                run.redis_cpu = await redis_cpu(redis) - cpu_at_take
                return
        await asyncio.sleep(0.05)


async def redis_cpu(redis: Redis) -> float:
    """Seconds of CPU the Redis process has spent, user and system (its main thread's and
    its own; the probe's calls are a few a poll)."""
    cpu = await redis.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _env(port: int, ports: dict[str, int], broker_prefix: str) -> dict[str, str]:
    """The stack's environment: the broker and MySQL of the machine's Ladder settings, the rest
    its own."""
    settings = load_settings()
    return child_environment(
        dict(
            LADDER_ENV="dev",
            LADDER_KEY_PREFIX=PREFIX,
            LADDER_BROKER_PREFIX=broker_prefix,
            LADDER_AMQP_URL=settings.amqp_url,
            LADDER_MYSQL_URL=settings.mysql_url,
            LADDER_REDIS_URL=f"redis://127.0.0.1:{port}/0",
            LADDER_API_PORT=str(ports["api"]),
            LADDER_AGGREGATOR_PORT=str(ports["aggregator"]),
            LADDER_API_WORKERS="1",
            LADDER_KEY_RATE="1000000",
            LADDER_LOG_LEVEL="WARNING",
        )
    )


async def measure() -> list[Line]:
    """The staleness rows, from a private stack of their own."""
    async with private_redis() as redis:
        port = int(redis.connection_pool.connection_kwargs["port"])
        keys = Keys(PREFIX)
        await fill_backlog(redis, keys)
        ports = {"api": free_port(), "aggregator": free_port()}
        broker_prefix = f"ladder-stale-{uuid.uuid4().hex[:8]}"
        env = _env(port, ports, broker_prefix)
        api_url = f"http://127.0.0.1:{ports['api']}"
        processes = [spawn("api", env)]
        run, stop = Run(), asyncio.Event()
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                await wait_ready(http, api_url)
                started = time.monotonic()  # the aggregator's start, as `make up` gives it
                processes.append(spawn("aggregator", env))
                tasks = [
                    asyncio.create_task(post_fresh(http, api_url, run, stop)),
                    asyncio.create_task(watch_hot(http, api_url, run, stop)),
                    asyncio.create_task(watch_pushes(redis, keys, run, stop)),
                ]
                watcher = asyncio.create_task(watch_global(http, api_url, redis, keys, run, stop))
                backlog = asyncio.create_task(watch_backlog(redis, keys, run, started))
                await wait_ready(http, f"http://127.0.0.1:{ports['aggregator']}")
                await backlog
                # Then a few more fresh scores, to see the steady state.
                await asyncio.sleep(3.0)
                stop.set()
                await asyncio.sleep(2 * INTERVAL)
                # The last fresh scores get 10 s more to show; those still waiting then count
                # as never shown.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watcher, timeout=10.0)
                for failed in await asyncio.gather(*tasks, return_exceptions=True):
                    if isinstance(failed, BaseException):
                        raise failed
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=30)
            await remove_topology(env["LADDER_AMQP_URL"], broker_prefix)
    return rows(run)


async def remove_topology(amqp_url: str, prefix: str) -> None:
    """The stack's exchange and queues, which the API's relay declared."""
    connection = await connect_broker(amqp_url.split(","))
    async with connection:
        await Topology(prefix=prefix).delete(await connection.channel())


def rows(run: Run) -> list[Line]:
    lags = [run.shown[u] - run.posted[u] for u in run.posted if u in run.shown]
    missing = len(run.posted) - len(lags)
    pushes = [run.pushed[u] - run.posted[u] for u in run.posted if u in run.pushed]
    worst = max(lags) if lags else float("inf")
    lines: list[Line] = [
        Row(
            f"global view staleness, start with a {BACKLOG:,}-user dirty backlog (worst of "
            f"{len(run.posted)} fresh scores)",
            f"{worst:.1f} s",
            "",
            f"≤ {TARGET:.0f} s",
            worst <= TARGET and not missing,
        ),
        Row(
            "  … backlog drained after the aggregator's start",
            f"not within {RUN_LIMIT:.0f} s" if run.drained is None else f"{run.drained:.1f} s",
        ),
    ]
    if run.begun is not None:
        lines.append(
            Row("  … the merge's first take after the aggregator's start", f"{run.begun:.1f} s")
        )
    if run.drained is not None and run.begun is not None:
        marks, spent = BACKLOG * len(MAIN_BOARD.periods), run.drained - run.begun
        lines.append(
            Row(
                f"  … the drain of its {marks:,} marks (a user's, a period), from that take",
                f"{spent:.1f} s",
                f"{marks / spent:,.0f} /s",
            )
        )
        lines.append(
            Row(
                "  … Redis CPU over the drain: a mark; share of the drain",
                f"{run.redis_cpu / marks * 1e6:.1f} µs; {100 * run.redis_cpu / spent:.0f} %",
            )
        )
    if missing:
        lines.append(Note(f"{missing} fresh scores never showed in the global view."))
    if run.refused:
        lines.append(Note(f"{run.refused} fresh POSTs were answered 503 (and sent again)."))
    entries = [run.entered[u] - run.posted[u] for u in run.posted if u in run.entered]
    if entries:
        # The entry itself, ahead of the as_of that vouches for everything before it: fresh
        # marks are merged ahead of the backlog's (services/aggregator/merge.py).
        figure = f"  … a fresh score's global entry, before the as_of: worst of {len(entries)}"
        lines.append(Row(figure, f"{max(entries):.1f} s"))
    if run.hot_ages:
        lines.append(Row("  … hot view's as_of age meanwhile: worst", f"{max(run.hot_ages):.1f} s"))
    if pushes:
        # Only the first ten fresh scores enter the region's top 10 (ties rank the earlier).
        figure = f"  … region top-10 push of a fresh score: worst of {len(pushes)}"
        lines.append(Row(figure, f"{max(pushes):.1f} s"))
    return lines


def main() -> int:
    for line in asyncio.run(measure()):
        if isinstance(line, Note):
            print(f"note: {line.text}")
        else:
            target = f"  (target {line.target})" if line.target else ""
            ratio = f" ({line.ratio})" if line.ratio else ""
            print(f"{line.figure}: {line.value}{ratio}{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
