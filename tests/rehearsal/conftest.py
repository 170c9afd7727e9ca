"""The cluster rehearsal of `make cluster-up`, driven as an operator drives it: through its APIs
on 8000 and 8001, `scripts/cluster.sh kill|start|ps`, its Redis nodes and its history database.

These tests need the rehearsal running (`make test-rehearsal` starts it): they fail, not skip,
without it. Each kills one process and starts it again, waiting until the rehearsal is whole
before the next test; their boards and users are their own (a random id)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.helpers import ADMIN, SERVER
from tests.stack import ROOT

HOST = "127.0.0.1"
APIS = (f"http://{HOST}:8000", f"http://{HOST}:8001")
REDIS_PORTS = tuple(range(7000, 7006))
RABBIT_PORTS = (5673, 5674, 5675)
DATABASE_URL = f"mysql+asyncmy://root@{HOST}:3306/ladder_cluster"
CLUSTER_SH = str(ROOT / "scripts/cluster.sh")


def cluster(*args: str) -> str:
    """``scripts/cluster.sh ARGS``: its output; a failure fails the test."""
    done = subprocess.run(
        ["bash", CLUSTER_SH, *args], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, f"cluster.sh {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def processes() -> dict[str, str]:
    """Each process of the rehearsal and its state (``make cluster-ps``)."""
    return {line.split()[0]: line.split()[1] for line in cluster("ps").splitlines() if line}


def pid_of(name: str) -> str | None:
    """The pid of a running process of the rehearsal, from ``make cluster-ps``."""
    for line in cluster("ps").splitlines():
        fields = line.replace(",", " ").split()
        if fields and fields[0] == name and fields[1] == "RUNNING":
            return fields[fields.index("pid") + 1]
    return None


def node(port: int) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, socket_timeout=2, decode_responses=True)


def role(port: int) -> str | None:
    try:
        with node(port) as client:
            return str(client.execute_command("ROLE")[0])
    except redis.RedisError:
        return None


def primaries() -> list[int]:
    return [port for port in REDIS_PORTS if role(port) == "master"]


def primary_of_slot(slot: int) -> int:
    with node(primaries()[0]) as client:
        for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
    raise LookupError(slot)


def whole() -> bool:
    """Every process runs, three Redis primaries each with a replica in sync, and the cluster
    says ok."""
    if any(state != "RUNNING" for state in processes().values()):
        return False
    roles = {port: role(port) for port in REDIS_PORTS}
    if list(roles.values()).count("master") != 3 or None in roles.values():
        return False
    for port, name in roles.items():
        with node(port) as client:
            if client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                return False
            if name == "slave" and client.info("replication")["master_link_status"] != "up":
                return False
    return all(_ready(f"{api}/readyz") for api in APIS)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_whole(within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not whole():
        assert time.monotonic() < deadline, f"the rehearsal is not whole: {processes()}"
        time.sleep(1)


@pytest.fixture(scope="session", autouse=True)
def rehearsal() -> None:
    """The rehearsal runs and is whole; `make test-rehearsal` started it."""
    try:
        states = processes()
    except AssertionError as exc:
        pytest.fail(f"the cluster rehearsal does not answer (make cluster-up): {exc}")
    assert states, "the cluster rehearsal is not running: make cluster-up"
    wait_whole()


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """After each test, whatever it killed is started again and the rehearsal is whole."""
    yield
    for name, state in processes().items():
        if state != "RUNNING":
            cluster("start", name)
    wait_whole()


@pytest.fixture
def board_id() -> str:
    return "r" + uuid.uuid4().hex[:10]


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=APIS[0], headers=SERVER, timeout=10) as client:
        yield client


async def make_board(board_id: str, **definition: object) -> None:
    async with httpx.AsyncClient(base_url=APIS[0], headers=ADMIN, timeout=10) as admin:
        answer = await admin.put(f"/v1/boards/{board_id}", json=definition)
        assert answer.status_code == 201, answer.text


@pytest.fixture
async def history() -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(DATABASE_URL)
    try:
        yield engine
    finally:
        await engine.dispose()


async def stored_events(engine: AsyncEngine, board_id: str) -> dict[str, int]:
    """Each event id of the board in the history database, with its count of rows."""
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT event_id, COUNT(*) FROM score_events WHERE board_id = :board "
                "GROUP BY event_id"
            ),
            {"board": board_id},
        )
        return {str(event_id): int(count) for event_id, count in rows}
