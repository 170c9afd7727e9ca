"""SIGTERM mid-load (docs/architecture.md, "Shutdown"): the API stops taking connections, closes
every WebSocket with 1001, answers no request with a 5xx, finishes what it holds and hands the
outbox to the broker; history, stopped the same way, finishes its batch. Every accepted event
ends up in MySQL exactly once.

A request that finds the listener closed (connection refused) or its idle keep-alive connection
closed under it (reset, no answer) was never taken: it is counted apart from the answers, and its
event may be in MySQL at most once.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
import uuid

import httpx
import pytest
import websockets
from redis.asyncio import Redis
from sqlalchemy import text
from websockets.exceptions import ConnectionClosed

from shared.db import open_engine
from shared.keys import Keys
from tests.helpers import SERVER, eventually, player_token
from tests.stack import Stack

pytestmark = pytest.mark.stack

SOCKETS = 8
WORKERS = 32
LOAD_BEFORE_STOP = 1.5


async def watch(url: str, topic: str | None) -> int | None:
    """Hold a socket open, reading pushes, until the server closes it; its close code."""
    async with websockets.connect(url) as ws:
        if topic is not None:
            await ws.send(json.dumps({"op": "subscribe", "topic": topic}))
        await ws.send(json.dumps({"op": "ping"}))
        try:
            async with asyncio.timeout(60):
                while True:
                    await ws.recv()
        except ConnectionClosed:
            pass
        return ws.close_code


async def test_sigterm_mid_load_loses_nothing_and_closes_sockets_with_1001(
    stack: Stack, redis: Redis
) -> None:
    run = uuid.uuid4().hex[:6]
    watchers = [
        asyncio.create_task(watch(f"{stack.ws}?token={player_token(f'p{i}-{run}')}", None))
        if i % 2
        else asyncio.create_task(
            watch(
                f"{stack.ws}?token={SERVER['Authorization'][7:]}", "leaderboard:main:global:daily"
            )
        )
        for i in range(SOCKETS)
    ]
    tally: collections.Counter[str] = collections.Counter()
    accepted: set[str] = set()
    unanswered: set[str] = set()
    stopping = asyncio.Event()

    async def worker(api: httpx.AsyncClient, w: int) -> None:
        i = 0
        while not stopping.is_set():
            i += 1
            event_id = f"sd-{run}-{w}-{i}"
            body = {
                "event_id": event_id,
                "user_id": f"u{w}-{i}-{run}",  # one user a request: no per-user limit
                "region": ("eu", "na", "apac")[i % 3],
                "value": (w * 7919 + i * 104729) % 1000,
            }
            tally["sent"] += 1
            try:
                answer = await api.post("/v1/boards/main/scores", json=body)
            except httpx.ConnectError:
                tally["refused"] += 1
                unanswered.add(event_id)
                await asyncio.sleep(0.05)
                continue
            except httpx.TransportError:
                tally["reset"] += 1
                unanswered.add(event_id)
                continue
            tally[f"{answer.status_code // 100}xx"] += 1
            if answer.is_success:
                accepted.add(event_id)
            else:
                tally[f"status {answer.status_code}: {answer.text[:80]}"] += 1

    limits = httpx.Limits(max_connections=WORKERS, max_keepalive_connections=WORKERS)
    async with httpx.AsyncClient(
        base_url=stack.api, headers=SERVER, timeout=30, limits=limits
    ) as api:
        workers = [asyncio.create_task(worker(api, w)) for w in range(WORKERS)]
        await asyncio.sleep(LOAD_BEFORE_STOP)
        assert not any(w.done() for w in watchers), [w.result() for w in watchers if w.done()]
        before_stop = tally["2xx"]
        # `make stop` sends SIGTERM and returns once the process is gone; history is stopped
        # the same way at the same moment, in the middle of its work.
        stop_started = time.monotonic()
        api_stop = asyncio.to_thread(stack.make, "stop", "SERVICE=api")
        history_stop = asyncio.to_thread(stack.make, "stop", "SERVICE=history")
        await asyncio.gather(api_stop, history_stop)
        stop_seconds = time.monotonic() - stop_started
        await asyncio.sleep(0.3)  # a few more attempts against the closed port
        stopping.set()
        await asyncio.gather(*workers)
    codes = await asyncio.gather(*watchers)

    # The relay handed the whole outbox to the broker before the process went.
    outbox = Keys(stack.settings.key_prefix).outbox("main")
    left_in_outbox = await redis.xlen(outbox)

    stack.make("start", "SERVICE=history")
    stack.wait_ready("history")
    async with open_engine(stack.settings.mysql_url) as engine:

        async def stored() -> dict[str, int] | None:
            async with engine.connect() as conn:
                rows = await conn.execute(
                    text(
                        "SELECT event_id, COUNT(*) FROM score_events"
                        " WHERE board_id = 'main' AND event_id LIKE :run GROUP BY event_id"
                    ),
                    {"run": f"sd-{run}-%"},
                )
                found = {event_id: int(count) for event_id, count in rows}
            return found if accepted <= found.keys() else None

        in_mysql = await eventually(stored, within=60)

    api_log = stack.log("api")
    print(
        f"\nSIGTERM after {LOAD_BEFORE_STOP} s of load ({before_stop} accepted by then); "
        f"the API and history were gone {stop_seconds:.2f} s later.\n"
        f"requests sent {tally['sent']}: 2xx {tally['2xx']}, 4xx {tally['4xx']}, "
        f"5xx {tally['5xx']}, refused (listener closed) {tally['refused']}, "
        f"reset (idle keep-alive closed, unanswered) {tally['reset']}\n"
        f"sockets closed with 1001: {codes.count(1001)} of {SOCKETS} (codes {sorted(set(codes))})"
        f"\noutbox left {left_in_outbox}; in MySQL: {len(in_mysql)} events, "
        f"{sum(1 for e in accepted if in_mysql.get(e) == 1)} of {len(accepted)} accepted once, "
        f"{len(in_mysql.keys() & unanswered)} unanswered ones stored"
    )
    assert tally["5xx"] == 0
    assert tally["2xx"] + tally["4xx"] + tally["refused"] + tally["reset"] == tally["sent"]
    assert tally["4xx"] == 0, tally
    assert tally["refused"] > 0, "the load did not go on past the stop"
    assert tally["2xx"] > before_stop, "no request was answered during the stop"
    assert codes == [1001] * SOCKETS
    assert left_in_outbox == 0
    assert all(in_mysql[e] == 1 for e in accepted)
    assert set(in_mysql) <= accepted | unanswered
    assert max(in_mysql.values()) == 1
    assert "timeout graceful shutdown exceeded" not in api_log
    assert stop_seconds < 10
