"""LADDER_REDIS_WAIT_REPLICAS (services/api/write/durable.py) on a private Redis primary with one
replica: a score write is answered once the replica holds it; with the replica stopped, single
writes and batches answer 503 with Retry-After, the event stays stored on the primary, and its
retry is the idempotent duplicate, again answered only once the replica has it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import redis as sync_redis
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from shared.keys import Keys
from shared.redis import open_redis
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem, score
from tests.helpers import SERVER, api_client
from tests.stack import free_port, wait_for

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

SCORES = "/v1/boards/main/scores"
BATCH = "/v1/boards/main/scores/batch"
TIMEOUT_MS = 300


@dataclass
class Pair:
    """A private primary and its replica, each a ``redis-server`` of this test."""

    primary: int
    replica: int
    processes: dict[int, subprocess.Popen[bytes]]

    def client(self, port: int) -> sync_redis.Redis:
        return sync_redis.Redis(port=port, socket_timeout=2, decode_responses=True)

    def linked(self) -> bool:
        with self.client(self.replica) as replica:
            link: str = replica.info("replication").get("master_link_status", "")
        return link == "up"

    def stop_replica(self) -> None:
        """The replica frozen (SIGSTOP): connected, acknowledging nothing."""
        self.processes[self.replica].send_signal(signal.SIGSTOP)

    def resume_replica(self) -> None:
        self.processes[self.replica].send_signal(signal.SIGCONT)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    folder = tempfile.mkdtemp(prefix="ladder-wait-")
    primary, replica = free_port(), free_port()
    while replica == primary:
        replica = free_port()
    processes: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for port, more in ((primary, []), (replica, ["--replicaof", "127.0.0.1", str(primary)])):
            directory = os.path.join(folder, str(port))
            os.mkdir(directory)
            plain = ["--save", "", "--appendonly", "no", "--dir", directory]
            processes[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", *plain, *more],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        servers = Pair(primary, replica, processes)
        wait_for("the replica's link to its primary", _quietly(servers.linked), 30)
        yield servers
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _quietly(check: object) -> object:
    def probe() -> bool:
        try:
            return bool(check())  # type: ignore[operator]
        except sync_redis.RedisError:
            return False

    return probe


@pytest.fixture
def waiting(quiet: LadderSettings, pair: Pair) -> LadderSettings:
    return quiet.model_copy(
        update={
            "redis_url": f"redis://127.0.0.1:{pair.primary}/0",
            "redis_cluster": False,
            "redis_wait_replicas": 1,
            "redis_wait_timeout_ms": TIMEOUT_MS,
        }
    )


@pytest.fixture
async def primary(waiting: LadderSettings, pair: Pair) -> AsyncIterator[Redis]:
    async with open_redis(waiting.redis_url, load_functions=True) as client:
        yield client
        pair.resume_replica()
        await client.flushdb()


def short_waits() -> float:
    return REGISTRY.get_sample_value("ladder_api_redis_wait_short_total") or 0.0


def waits_timed() -> float:
    return REGISTRY.get_sample_value("ladder_api_redis_wait_seconds_count") or 0.0


async def test_writes_are_answered_once_the_replica_holds_them(
    waiting: LadderSettings, primary: Redis, pair: Pair
) -> None:
    keys = Keys(waiting.key_prefix)
    timed = waits_timed()
    async with api_client(waiting) as client:
        answer = await client.post(SCORES, json=score(event_id="w1", value=7), headers=SERVER)
        assert answer.status_code == 200, answer.text
        assert answer.json()["duplicate"] is False
        events = [score(event_id=f"b{i}", user_id=f"u-{i}", value=i) for i in range(5)]
        batch = await client.post(BATCH, json={"events": events}, headers=SERVER)
        assert batch.status_code == 200, batch.text
        assert [r["duplicate"] for r in batch.json()["results"]] == [False] * 5
    # What was answered is on the replica at once, not eventually.
    with pair.client(pair.replica) as replica:
        assert replica.exists(keys.idempotency("main", "w1", "u-1")) == 1
        assert replica.exists(keys.idempotency("main", "b4", "u-4")) == 1
    assert waits_timed() >= timed + 2


async def test_a_stopped_replica_makes_writes_503_and_their_retries_duplicates(
    waiting: LadderSettings, primary: Redis, pair: Pair
) -> None:
    keys = Keys(waiting.key_prefix)
    event = f"e-{uuid.uuid4().hex[:8]}"
    body = score(event_id=event, value=11)
    short = short_waits()
    async with api_client(waiting) as client:
        pair.stop_replica()
        started = time.monotonic()
        refused = await client.post(SCORES, json=body, headers=SERVER)
        took = time.monotonic() - started
        problem = assert_problem(refused, 503)
        assert "0 of the 1 replicas" in problem["detail"]
        assert refused.headers["retry-after"] == "1"
        assert took >= TIMEOUT_MS / 1000 * 0.9
        # Stored on the primary all the same: its record and its outbox entry.
        assert await primary.exists(keys.idempotency("main", event, "u-1")) == 1
        assert await primary.xlen(keys.outbox("main")) == 1
        # A retry while the replica is still away: the duplicate, still unconfirmed.
        again = await client.post(SCORES, json=body, headers=SERVER)
        assert_problem(again, 503)
        events = [score(event_id=f"{event}-b{i}", user_id=f"u-{i}") for i in range(3)]
        batch = await client.post(BATCH, json={"events": events}, headers=SERVER)
        assert_problem(batch, 503)
        assert short_waits() >= short + 3
        pair.resume_replica()
        wait_for("the replica back", _quietly(pair.linked), 30)
        retried = await client.post(SCORES, json=body, headers=SERVER)
        assert retried.status_code == 200, retried.text
        assert retried.json()["duplicate"] is True
        assert retried.json()["periods"]["alltime"]["score"] == 11
        batch = await client.post(BATCH, json={"events": events}, headers=SERVER)
        assert batch.status_code == 200, batch.text
        assert [r["duplicate"] for r in batch.json()["results"]] == [True] * 3
    # Written once: one outbox entry for the single event and one per batch event.
    assert await primary.xlen(keys.outbox("main")) == 4
    with pair.client(pair.replica) as replica:
        assert replica.exists(keys.idempotency("main", event, "u-1")) == 1


async def test_a_refusal_is_answered_as_it_is_without_replicas(
    waiting: LadderSettings, primary: Redis, pair: Pair
) -> None:
    """Only what would be answered 2xx waits for replicas: a 409 is a 409 with the replica
    stopped."""
    async with api_client(waiting) as client:
        first = await client.post(SCORES, json=score(event_id="c1", value=3), headers=SERVER)
        assert first.status_code == 200, first.text
        pair.stop_replica()
        other = await client.post(SCORES, json=score(event_id="c1", value=4), headers=SERVER)
        assert_problem(other, 409)
