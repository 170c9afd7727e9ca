"""What the bench measures from outside Ladder: how far an ingest got through the consumers,
POST-to-push latency on a WebSocket, a board of a million members, the aggregator's merge,
memory and row sizes; and how it cleans up after itself."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import websockets
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy import bindparam, text
from sqlalchemy.engine import make_url

from services.history.handlers import HistoryHandler
from services.history.migrate import migrate
from shared.db import open_engine
from shared.events import ScoreAccepted, rfc3339
from shared.keys import Keys
from shared.ranking import member, record, tie_key
from shared.settings import LadderSettings

BOARDS = ("bench-single", "bench-batch", "bench-ws", "bench-reads")
CONSUMERS = {
    "aggregator": "aggregator_port",
    "history": "history_port",
    "notifier": "notifier_port",
}
# How long the push probe waits for a push before counting it missed.
PUSH_WAIT_SECONDS = 5.0
# The longest the clean-up waits for Redis to free what it unlinked (a 1M board: well under 1 s).
FREE_WAIT_SECONDS = 120


@dataclass
class Ladder:
    """The running Ladder, as the bench sees it."""

    settings: LadderSettings
    redis: Redis
    http: httpx.AsyncClient
    server_key: str
    admin_key: str

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.settings.api_port}"

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.key_prefix)

    def auth(self, admin: bool = False) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key if admin else self.server_key}"}

    async def define(self, board_id: str, **spec: Any) -> None:
        response = await self.http.put(
            f"{self.api}/v1/boards/{board_id}", json=spec, headers=self.auth(admin=True)
        )
        response.raise_for_status()

    async def accepted(self, board_id: str) -> int:
        """Events the API accepted on a board: the entries ever added to its outbox stream
        (``XINFO STREAM``'s ``entries-added``), which the same atomic step as each accepted score
        appends to. The board's event counter would trail: the aggregator keeps it."""
        try:
            info = await self.redis.xinfo_stream(self.keys.outbox(board_id))
        except ResponseError:  # no outbox yet: nothing accepted
            return 0
        return int(info["entries-added"])

    async def settled(self, board_id: str) -> int:
        """:meth:`accepted` once it stops moving: requests still in flight when wrk stopped
        are answered (and counted) after it returns."""
        last = await self.accepted(board_id)
        while True:
            await asyncio.sleep(1.0)
            now = await self.accepted(board_id)
            if now == last:
                return now
            last = now

    async def consumed(self) -> dict[str, float]:
        """Events each consumer has handled (its ``ladder_consumer_events_total``)."""
        out: dict[str, float] = {}
        for name, port_field in CONSUMERS.items():
            port = getattr(self.settings, port_field)
            response = await self.http.get(f"http://127.0.0.1:{port}/metrics")
            total = 0.0
            for family in text_string_to_metric_families(response.text):
                if family.name == "ladder_consumer_events":
                    total += sum(s.value for s in family.samples if s.name.endswith("_total"))
            out[name] = total
        return out

    async def relayed(self) -> tuple[float, float]:
        """(events, messages) the API's relays have had confirmed, all workers together."""
        response = await self.http.get(f"{self.api}/metrics")
        found = {"ladder_relay_events": 0.0, "ladder_relay_messages": 0.0}
        for family in text_string_to_metric_families(response.text):
            if family.name in found:
                found[family.name] = sum(
                    s.value for s in family.samples if s.name.endswith("_total")
                )
        return found["ladder_relay_events"], found["ladder_relay_messages"]

    async def stored_rows(self, board_id: str) -> int:
        async with open_engine(self.settings.mysql_url) as engine, engine.connect() as conn:
            result = await conn.execute(
                text("SELECT COUNT(*) FROM score_events WHERE board_id = :b"), {"b": board_id}
            )
            return int(result.scalar_one())

    async def drained(
        self, board_id: str, rows: int, consumed: dict[str, float], events: int, deadline: float
    ) -> float | None:
        """Wait until ``rows`` rows of the board are in MySQL, every consumer has handled
        ``events`` more events than ``consumed`` and the outbox is empty; the time it happened
        (``time.monotonic``), or ``None`` past ``deadline``."""
        report_at = time.monotonic() + 10
        async with open_engine(self.settings.mysql_url) as engine:
            while time.monotonic() < deadline:
                async with engine.connect() as conn:
                    result = await conn.execute(
                        text("SELECT COUNT(*) FROM score_events WHERE board_id = :b"),
                        {"b": board_id},
                    )
                    stored = int(result.scalar_one())
                now_consumed = await self.consumed()
                backlog = await self.redis.xlen(self.keys.outbox(board_id))
                behind = {c: events - (now_consumed[c] - consumed[c]) for c in CONSUMERS}
                if stored >= rows and backlog == 0 and all(n <= 0 for n in behind.values()):
                    return time.monotonic()
                if time.monotonic() >= report_at:
                    report_at += 10
                    print(
                        f"    waiting: {stored}/{rows} rows in MySQL, outbox {backlog}, "
                        f"events not yet handled {behind}",
                        flush=True,
                    )
                await asyncio.sleep(0.1)
        return None

    async def freed(self) -> None:
        """Wait until Redis has freed what ``UNLINK`` handed to its background thread. A
        million-member board takes seconds to free, on a thread whose CPU is Redis's: a phase
        started meanwhile would be measured against it on the same two cores."""
        deadline = time.monotonic() + FREE_WAIT_SECONDS
        while (await self.redis.info("memory")).get("lazyfree_pending_objects", 0):
            if time.monotonic() >= deadline:
                print(f"    Redis still freeing deleted keys after {FREE_WAIT_SECONDS} s")
                return
            await asyncio.sleep(0.05)

    async def clean(self, bench_prefix: str) -> None:
        """Remove every trace of the bench boards and of the bench prefix."""
        patterns = [self.keys.tag(b) + ":*" for b in BOARDS]
        patterns += [bench_prefix + ":*", "{" + bench_prefix + ":*"]
        for pattern in patterns:
            batch: list[str] = []
            async for key in self.redis.scan_iter(match=pattern, count=5000):
                batch.append(key)
                if len(batch) >= 5000:
                    await self.redis.unlink(*batch)
                    batch.clear()
            if batch:
                await self.redis.unlink(*batch)
        await self.redis.hdel(self.keys.boards, *BOARDS)
        await self.freed()
        async with open_engine(self.settings.mysql_url) as engine, engine.begin() as conn:
            for table in ("score_events", "boards", "snapshots"):
                exists = await conn.execute(
                    text(
                        "SELECT COUNT(*) FROM information_schema.TABLES "
                        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t"
                    ),
                    {"t": table},
                )
                if exists.scalar_one():
                    statement = text(f"DELETE FROM {table} WHERE board_id IN :boards")
                    await conn.execute(
                        statement.bindparams(bindparam("boards", expanding=True)),
                        {"boards": list(BOARDS)},
                    )


# --- POST -> WebSocket push --------------------------------------------------------------------


async def push_latency(ladder: Ladder, samples: int) -> tuple[list[float], int]:
    """Milliseconds from sending a POST to receiving the ``rank`` push it causes, one sample a
    socket: a fresh user that scores more than anyone before it enters the top 1 of its region,
    so the notifier pushes ``entered_top`` to its ``user:`` topic. Also how many pushes did not
    come within ``PUSH_WAIT_SECONDS``."""
    board = "bench-ws"
    run = uuid.uuid4().hex[:8]
    url = f"ws://127.0.0.1:{ladder.settings.api_port}/v1/ws?token={ladder.server_key}"
    latencies: list[float] = []
    missed = 0
    for i in range(samples):
        user = f"w{run}-{i}"
        async with websockets.connect(url) as socket:
            await socket.send(orjson.dumps({"op": "subscribe", "topic": f"user:{user}"}).decode())
            await socket.send('{"op": "ping"}')
            while orjson.loads(await socket.recv()).get("type") != "pong":
                pass
            body = {"event_id": f"{user}-e", "user_id": user, "region": "eu", "value": 10 + i}
            started = time.perf_counter()
            response = await ladder.http.post(
                f"{ladder.api}/v1/boards/{board}/scores", json=body, headers=ladder.auth()
            )
            response.raise_for_status()
            try:
                async with asyncio.timeout(PUSH_WAIT_SECONDS):
                    while True:
                        message = orjson.loads(await socket.recv())
                        if message.get("type") == "rank" and message.get("user_id") == user:
                            break
            except TimeoutError:
                missed += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies, missed


# --- a board of a million members ----------------------------------------------------------------


# Reach times of the filled entries: a year of milliseconds before this one.
_REACHED_FROM, _REACHED_SPAN = 1_733_000_000_000, 365 * 86_400_000


def layout_entries(
    rng: random.Random, ids: Iterable[str]
) -> tuple[dict[str, float], dict[Any, str]]:
    """Entries of a descending board in the layout of shared/ranking.py, with random scores and
    reach times: ``({member: score}, {id: record})`` for its sorted set and its hash."""
    mapping: dict[str, float] = {}
    ties: dict[Any, str] = {}
    for entry in ids:
        tie = tie_key(_REACHED_FROM + rng.randrange(_REACHED_SPAN))
        score = rng.randrange(1_000_000)
        mapping[member(tie, entry)] = score
        ties[entry] = record(tie, score)
    return mapping, ties


async def fill_board(redis: Redis, key: str, members: int, *, chunk: int = 1000) -> float:
    """Write ``members`` all-time entries straight into a board's sorted set and its hash of
    records (shared/ranking.py), pipelined; returns the seconds it took."""
    rng = random.Random(7)
    started = time.monotonic()
    for start in range(0, members, chunk * 20):
        async with redis.pipeline(transaction=False) as pipe:
            for offset in range(start, min(members, start + chunk * 20), chunk):
                ids = (f"u{i}" for i in range(offset, min(members, offset + chunk)))
                mapping, ties = layout_entries(rng, ids)
                pipe.zadd(key, mapping)
                pipe.hset(Keys.ties(key), mapping=ties)
            await pipe.execute()
    return time.monotonic() - started


def read_paths(board: str, members: int, count: int = 500) -> dict[str, list[str]]:
    rng = random.Random(11)
    users = [f"u{rng.randrange(members)}" for _ in range(count)]
    base = f"/v1/boards/{board}"
    query = "scope=region:eu&period=alltime"
    return {
        "rank": [f"{base}/users/{u}?{query}" for u in users],
        "around-me (±5)": [f"{base}/users/{u}?{query}&around=5" for u in users],
        "top-100": [f"{base}/leaderboard?{query}&limit=100"],
    }


async def memory_of(redis: Redis, key: str) -> int:
    return int(await redis.memory_usage(key, samples=0) or 0)


async def used_memory(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


# --- MySQL bytes per event -----------------------------------------------------------------------


async def mysql_bytes_per_event(mysql_url: str, rows: int) -> tuple[float, float]:
    """Store ``rows`` events through the history handler into a bench-only database; returns
    (data + index bytes per row after ANALYZE, rows a second stored). The database is dropped."""
    url = make_url(mysql_url).set(database="ladder_bench")
    bench_url = url.render_as_string(hide_password=False)
    await migrate(bench_url)
    try:
        async with open_engine(bench_url) as engine:
            handler = HistoryHandler(engine)
            now = datetime.now(UTC)
            started = time.monotonic()
            for start in range(0, rows, 500):
                events = [
                    ScoreAccepted.model_validate(
                        {
                            "event_id": f"e{i}-{uuid.uuid4().hex[:12]}",
                            "board_id": "bench",
                            "user_id": f"u{i % 100_000}",
                            "region": f"r{i % 8}",
                            "team_id": f"t{i % 100}",
                            "value": i % 1000,
                            "occurred_at": rfc3339(now),
                            "accepted_at": rfc3339(now),
                            "periods": {},
                        }
                    )
                    for i in range(start, min(rows, start + 500))
                ]
                await handler(events)
            rate = rows / (time.monotonic() - started)
            async with engine.connect() as conn:
                await conn.execute(text("ANALYZE TABLE score_events"))
                result = await conn.execute(
                    text(
                        "SELECT DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES "
                        "WHERE TABLE_SCHEMA = 'ladder_bench' AND TABLE_NAME = 'score_events'"
                    )
                )
                size = int(result.scalar_one())
    finally:
        async with open_engine(mysql_url) as engine, engine.begin() as conn:
            await conn.execute(text("DROP DATABASE IF EXISTS ladder_bench"))
    return size / rows, rate


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values)
