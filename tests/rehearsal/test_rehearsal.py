"""Faults on the cluster rehearsal (`make cluster-up`), each under a stream of writes where the
fault is about load: a Redis primary killed, an aggregator killed while it merges, a RabbitMQ
node killed; and what two API processes and three primaries must show at rest."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import pytest
import websockets
from redis.crc import key_slot
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.keys import Keys
from tests.helpers import SERVER, eventually, player_token
from tests.rehearsal.conftest import (
    APIS,
    RABBIT_PORTS,
    cluster,
    make_board,
    node,
    pid_of,
    primaries,
    primary_of_slot,
    processes,
    stored_events,
)
from tests.stack import Socket

pytestmark = pytest.mark.rehearsal

T = TypeVar("T")
KEYS = Keys("ladder")
MERGE_INTERVAL = 2.0  # the services' default, which the rehearsal keeps
RESUME_WITHIN = 15.0


def primary_of(board_id: str) -> int:
    return primary_of_slot(key_slot(KEYS.tag(board_id).encode()))


@dataclass
class Stream:
    """Writes of value 1 to an ``incr`` board, alternating between the two APIs, each with an
    event id of its own; every answer kept as (time, status, event id)."""

    board_id: str
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, pause: float = 0.01, users: int = 40) -> None:
        clients = [httpx.AsyncClient(base_url=api, headers=SERVER, timeout=5) for api in APIS]
        try:
            n = 0
            while not self._stop.is_set():
                event_id = f"e{n}-{uuid.uuid4().hex[:8]}"
                user = f"u{n % users}"
                body = {"event_id": event_id, "user_id": user, "region": "eu", "value": 1}
                try:
                    answer = await clients[n % 2].post(
                        f"/v1/boards/{self.board_id}/scores", json=body
                    )
                    status = answer.status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((time.monotonic(), status, event_id))
                n += 1
                await asyncio.sleep(pause)
        finally:
            for client in clients:
                await client.aclose()

    def stop(self) -> None:
        self._stop.set()

    def accepted(self) -> set[str]:
        return {event_id for _, status, event_id in self.answers if 200 <= status < 300}

    def resumed_after(self, since: float) -> float:
        """Seconds from ``since`` to the first write answered 2xx after it."""
        return next(t for t, status, _ in self.answers if t > since and status == 200) - since

    def refused_after(self, since: float) -> int:
        return sum(1 for t, status, _ in self.answers if t > since and status != 200)


async def written_for(stream: Stream, seconds: float) -> None:
    count = len(stream.answers)
    await asyncio.sleep(seconds)
    assert len(stream.answers) > count, "the stream wrote nothing"


async def all_in_history(history: AsyncEngine, board_id: str, events: set[str]) -> bool:
    stored = await stored_events(history, board_id)
    return events <= stored.keys() or None  # type: ignore[return-value]


async def test_twelve_boards_spread_their_writes_over_the_primaries(board_id: str) -> None:
    boards = [f"{board_id}-{i}" for i in range(12)]
    for n, board in enumerate(boards):
        await make_board(board)
        async with httpx.AsyncClient(base_url=APIS[n % 2], headers=SERVER, timeout=10) as api:
            body = {"user_id": "u-1", "region": "eu", "value": 5}
            answer = await api.post(f"/v1/boards/{board}/scores", json=body)
            assert answer.status_code == 200, answer.text
    homes: dict[int, list[str]] = {}
    for board in boards:
        port = primary_of(board)
        with node(port) as client:
            held = list(client.scan_iter(match=KEYS.tag(board) + "*", count=1000))
        assert held, f"no key of board {board} on its primary {port}"
        homes.setdefault(port, []).append(board)
    print("boards a primary:", {port: len(held) for port, held in sorted(homes.items())})
    assert len(homes) >= 2


async def test_a_write_on_api_8000_pushes_to_a_socket_on_api_8001(board_id: str) -> None:
    await make_board(board_id)
    url = APIS[1].replace("http", "ws") + f"/v1/ws?token={player_token('watcher')}"
    connection = await websockets.connect(url)
    try:
        watcher = Socket(connection)
        await watcher.send({"op": "subscribe", "topic": f"leaderboard:{board_id}:global:alltime"})
        await watcher.sync()
        assert not [m for m in watcher.received if m["type"] == "error"], watcher.received
        hero = f"hero-{uuid.uuid4().hex[:6]}"
        written = time.monotonic()
        async with httpx.AsyncClient(base_url=APIS[0], headers=SERVER, timeout=10) as api:
            body = {"user_id": hero, "region": "eu", "value": 25}
            answer = await api.post(f"/v1/boards/{board_id}/scores", json=body)
            assert answer.status_code == 200, answer.text
        pushed = await watcher.expect(
            lambda m: (
                m["type"] == "leaderboard" and any(e["user_id"] == hero for e in m["entries"])
            ),
            within=20,
        )
        print(f"pushed on 8001 {time.monotonic() - written:.2f} s after the write on 8000")
        assert (pushed["board_id"], pushed["scope"]) == (board_id, "global")
    finally:
        await connection.close()


def lease_owner_process(board_id: str) -> str | None:
    """The aggregator process (aggregator-N) holding the board's merge lease now, if one does."""
    with node(primary_of(board_id)) as client:
        token = client.get(KEYS.merge_lease(board_id))
    if token is None:
        return None
    pid = token.split("|", 1)[1].split(":")[1]
    for name in ("aggregator-1", "aggregator-2"):
        if pid_of(name) == pid:
            return name
    return None


async def test_an_aggregator_killed_while_it_merges_is_taken_over(
    board_id: str, api: httpx.AsyncClient
) -> None:
    await make_board(board_id)
    stream = Stream(board_id)
    writing = asyncio.create_task(stream.run(users=5_000))
    try:
        owner = await eventually(lambda: _value(lease_owner_process(board_id)), within=30)
        cluster("kill", owner)
        killed = time.monotonic()
        await written_for(stream, 1.0)
        fresh = f"fresh-{uuid.uuid4().hex[:6]}"
        body = {"user_id": fresh, "region": "us", "value": 1_000_000}
        assert (await api.post(f"/v1/boards/{board_id}/scores", json=body)).status_code == 200

        async def fresh_leads() -> bool | None:
            page = (await api.get(f"/v1/boards/{board_id}/leaderboard?limit=1")).json()
            return (bool(page["entries"]) and page["entries"][0]["user_id"] == fresh) or None

        await eventually(fresh_leads, within=30)
        merged_after = time.monotonic() - killed
        taker = lease_owner_process(board_id)
    finally:
        stream.stop()
        await writing
    print(
        f"{owner} killed while it held the lease; a write made after the kill was in the global "
        f"view {merged_after:.1f} s later (merge interval {MERGE_INTERVAL} s); lease now: {taker}"
    )
    # The lease runs out within three merge intervals; a merge pass and a push follow.
    assert merged_after < 5 * MERGE_INTERVAL
    assert processes()[owner] != "RUNNING"


async def test_a_primary_killed_under_writes_loses_no_accepted_event(
    board_id: str, history: AsyncEngine
) -> None:
    await make_board(board_id)
    victim = primary_of(board_id)
    stream = Stream(board_id)
    writing = asyncio.create_task(stream.run())
    try:
        await written_for(stream, 2.0)
        cluster("kill", f"redis-{victim}")
        killed = time.monotonic()
        # With one replica a shard, WAIT 1 holds the shard's writes (503) from the failover until
        # a replica is back: the killed node is started again, as a process manager would, once
        # its replica has taken its place, and rejoins as that one's replica.
        await eventually(lambda: _value(victim not in primaries() or None), within=RESUME_WITHIN)
        promoted = time.monotonic() - killed
        cluster("start", f"redis-{victim}")
        back = time.monotonic() - killed
        deadline = killed + RESUME_WITHIN + 5
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            if any(t > killed + back and status == 200 for t, status, _ in stream.answers):
                break
        await written_for(stream, 2.0)
    finally:
        stream.stop()
        await writing
    resumed = stream.resumed_after(killed)
    accepted = stream.accepted()
    print(
        f"redis-{victim} killed: its replica promoted {promoted:.1f} s later, the killed node "
        f"started again at {back:.1f} s, writes answered 200 again at {resumed:.1f} s; "
        f"{stream.refused_after(killed)} refused meanwhile, {len(accepted)} accepted in all"
    )
    assert resumed < RESUME_WITHIN
    assert victim not in primaries()
    await eventually(lambda: all_in_history(history, board_id, accepted), within=90)
    stored = await stored_events(history, board_id)
    assert accepted <= stored.keys()
    assert set(stored.values()) == {1}


async def test_a_rabbitmq_node_killed_under_writes_loses_and_doubles_nothing(
    board_id: str, api: httpx.AsyncClient, history: AsyncEngine
) -> None:
    await make_board(board_id)
    victim = RABBIT_PORTS[0]  # every client's first address: most connections are on it
    stream = Stream(board_id)
    writing = asyncio.create_task(stream.run())
    try:
        await written_for(stream, 2.0)
        cluster("kill", f"rabbit-{victim}")
        await written_for(stream, 8.0)
    finally:
        stream.stop()
        await writing
    accepted = stream.accepted()
    refused = len(stream.answers) - len(accepted)
    print(f"rabbit-{victim} killed: {len(accepted)} writes accepted, {refused} refused")
    await eventually(lambda: all_in_history(history, board_id, accepted), within=90)
    stored = await stored_events(history, board_id)
    assert stored.keys() == accepted
    assert set(stored.values()) == {1}

    async def counted() -> dict[str, Any] | None:
        stats = (await api.get(f"/v1/boards/{board_id}/stats?period=alltime")).json()
        return stats if stats["events"] >= len(accepted) else None

    # The aggregator counts each event once however often the broker delivers it.
    stats = await eventually(counted, within=60)
    await asyncio.sleep(2 * MERGE_INTERVAL)
    stats = (await api.get(f"/v1/boards/{board_id}/stats?period=alltime")).json()
    assert stats["events"] == len(accepted)
    # Both processes of each consumer pair are back, on a live node.
    consumers = await eventually(lambda: _value(both_consuming(RABBIT_PORTS[1])), within=30)
    print(f"consumers a queue after the kill: {consumers}")


def both_consuming(port: int) -> dict[str, int] | None:
    """Each of Ladder's work queues (not its dead-letter queues) with its consumers, once every
    one has the two of its pair."""
    queues = {q: n for q, n in queue_consumers(port).items() if not q.endswith(".dead")}
    assert len(queues) == 3, queues
    return queues if set(queues.values()) == {2} else None


def queue_consumers(port: int) -> dict[str, int]:
    """Each of Ladder's queues on the rehearsal's broker and its count of consumers."""
    done = subprocess.run(
        [
            "rabbitmqctl",
            "-q",
            "-n",
            f"ladder-rabbit-{port}@localhost",
            "list_queues",
            "name",
            "consumers",
            "--formatter",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    queues = {row["name"]: int(row["consumers"]) for row in json.loads(done.stdout)}
    ladder = {name: n for name, n in queues.items() if name.startswith("ladder.")}
    assert ladder, f"no queue of Ladder on rabbit-{port}: {sorted(queues)}"
    return ladder


async def _value(value: T | None) -> T | None:
    return value
