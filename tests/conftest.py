"""Fixtures: real Redis, RabbitMQ and MySQL on loopback, isolated per test.

Each test gets its own key prefix, broker prefix (exchange and queue names) and MySQL database,
so that a running `make up` and other tests are never disturbed.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from aio_pika.abc import AbstractChannel
from redis import Redis as SyncRedis
from redis import RedisError
from redis.asyncio import Redis

from shared.amqp import connect as connect_broker
from shared.keys import Keys
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import UNREACHABLE_BROKER, server_statement
from tests.mysql_template import MigratedTemplate
from tests.redis_cluster import PrivateCluster
from tests.stack import Stack

# Database 1, not a running Ladder's 0: the tests' SCANs of their own prefixes then walk only
# the tests' keys, however many a running Ladder holds (timing-sensitive cases, rate limits
# refilling within a second above all, depend on it).
REDIS_URL = os.environ.get("LADDER_TEST_REDIS_URL", "redis://127.0.0.1:6379/1")
AMQP_URL = os.environ.get("LADDER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
MYSQL_SERVER_URL = os.environ.get("LADDER_TEST_MYSQL_URL", "mysql+asyncmy://root@127.0.0.1:3306")
# LADDER_TEST_REDIS_CLUSTER=1 (make test-cluster): the tests' Redis is a Redis Cluster. With
# LADDER_TEST_REDIS_URL given too, it is the running cluster that URL names (make test-rehearsal
# names `make cluster-up`'s, redis://127.0.0.1:7000/0; a cluster has database 0 only); without
# it, a private cluster of six nodes on free ports, started once for the session
# (tests/redis_cluster.py).
MANAGEMENT_PORT = 15672  # the RabbitMQ management API's, which scripts/infra.sh enables
TEST_QUEUE_EXPIRES_MS = 30 * 60 * 1000
ON_CLUSTER = os.environ.get("LADDER_TEST_REDIS_CLUSTER", "") not in ("", "0")
CLUSTER_URL = os.environ.get("LADDER_TEST_REDIS_URL", "") if ON_CLUSTER else ""


def check_cluster_url(url: str) -> None:
    """Fail the session at once, saying why, if ``url`` does not name a node of a Redis Cluster
    whose state is ok."""
    where = "LADDER_TEST_REDIS_URL with LADDER_TEST_REDIS_CLUSTER=1"
    if urlsplit(url).path.strip("/") not in ("", "0"):
        pytest.exit(f"{where}: {url} names a database other than 0, which a cluster has not", 2)
    try:
        with SyncRedis.from_url(url, socket_timeout=5, decode_responses=True) as client:
            info = client.execute_command("CLUSTER INFO")
    except RedisError as error:
        pytest.exit(f"{where}: {url} is not a node of a Redis Cluster that answers: {error}", 2)
    if info.get("cluster_state") != "ok":
        pytest.exit(f"{where}: the cluster of {url} is {info.get('cluster_state')}, not ok", 2)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the tests' Redis: LADDER_TEST_REDIS_URL, or a node of the private cluster."""
    if not ON_CLUSTER:
        yield REDIS_URL
        return
    if CLUSTER_URL:
        check_cluster_url(CLUSTER_URL)
        yield CLUSTER_URL
        return
    cluster = PrivateCluster()
    try:
        yield cluster.start().url
    finally:
        cluster.remove()


@pytest.fixture(scope="session", autouse=True)
def test_queues_expire() -> None:
    """A broker policy: a queue of the tests (named ``lt-...``) left unused for half an hour is
    deleted by the broker. A run stopped before its teardowns (killed, timed out) leaves its
    queues behind, and a few hundred idle quorum queues on a broker limited to 1,024 open files
    leave it unable to take connections. Set through the management API where it answers (with
    the tests' AMQP credentials); where it does not, queues are left as they are."""
    amqp = urlsplit(AMQP_URL)
    url = f"http://{amqp.hostname}:{MANAGEMENT_PORT}/api/policies/%2F/ladder-tests"
    policy = {
        "pattern": "^lt-",
        "definition": {"expires": TEST_QUEUE_EXPIRES_MS},
        "apply-to": "queues",
        "priority": 0,
    }
    auth = (amqp.username or "guest", amqp.password or "guest")
    with contextlib.suppress(httpx.HTTPError):
        httpx.put(url, json=policy, auth=auth, timeout=5)


@pytest.fixture
def test_id() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def settings(test_id: str, redis_url: str) -> LadderSettings:
    """Settings of an isolated Ladder: its own prefixes and database, dev credentials."""
    return LadderSettings(
        _env_file=None,  # type: ignore[call-arg]
        env="dev",
        redis_url=redis_url,
        redis_cluster=ON_CLUSTER,
        amqp_url=AMQP_URL,
        mysql_url=f"{MYSQL_SERVER_URL}/ladder_{test_id}",
        key_prefix=f"lt-{test_id}",
        broker_prefix=f"lt-{test_id}",
        merge_interval=0.2,
    )


@pytest.fixture
def quiet(settings: LadderSettings) -> LadderSettings:
    """The test's settings with an unreachable broker: accepted events stay in the outbox and
    nothing but the requests themselves changes Redis."""
    return settings.model_copy(
        update={"amqp_url": UNREACHABLE_BROKER, "shutdown_grace_seconds": 1.0}
    )


@pytest.fixture
def keys(settings: LadderSettings) -> Keys:
    return Keys(settings.key_prefix)


@pytest.fixture
async def redis(settings: LadderSettings) -> AsyncIterator[Redis]:
    """A client; every key of the test's prefix is removed afterwards."""
    async with open_redis(
        settings.redis_url, load_functions=True, cluster=settings.redis_cluster
    ) as client:
        yield client
        prefix = settings.key_prefix
        for pattern in (f"{prefix}:*", "{" + prefix + ":*"):
            batch = [k async for k in client.scan_iter(match=pattern, count=1000)]
            if batch:
                await client.delete(*batch)


@pytest.fixture
async def broker(settings: LadderSettings) -> AsyncIterator[Topology]:
    """The test's own exchange and queues, deleted afterwards."""
    topology = Topology(prefix=settings.broker_prefix, delivery_limit=settings.delivery_limit)
    yield topology
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        await topology.delete(channel)


@pytest.fixture
async def channel(settings: LadderSettings, broker: Topology) -> AsyncIterator[AbstractChannel]:
    """A confirming channel on which the test's topology (``broker``) exists, so nothing
    published before a consumer starts is lost."""
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        chan = await connection.channel(publisher_confirms=True)
        await broker.declare(chan)
        yield chan


@pytest.fixture(scope="session")
def mysql_template() -> Iterator[MigratedTemplate]:
    """A database of this session (of this process: each xdist worker has its own), migrated
    to head once, on first use, and dropped at the end; ``mysql_database`` copies it."""
    template = MigratedTemplate(MYSQL_SERVER_URL, f"ladder_template_{uuid.uuid4().hex[:12]}")
    yield template
    template.drop()


@pytest.fixture
async def mysql_database(
    settings: LadderSettings, test_id: str, mysql_template: MigratedTemplate
) -> AsyncIterator[str]:
    """The test's own MySQL database at the migrations' head, dropped afterwards: a copy of the
    session's migrated template (its tables' definitions and rows, alembic's revision among
    them), or migrated for real where a copy could miss something (see MigratedTemplate)."""
    await mysql_template.copy_to(settings.mysql_url)
    yield f"ladder_{test_id}"
    await server_statement(MYSQL_SERVER_URL, f"DROP DATABASE IF EXISTS `ladder_{test_id}`")


@pytest.fixture
def stack(
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    mysql_database: str,
    tmp_path: Path,
) -> Iterator[Stack]:
    """The four services running as processes under supervisord, for this test alone."""
    ladder = Stack(settings, tmp_path / "run")
    try:
        ladder.start()
        yield ladder
    finally:
        ladder.shutdown()
