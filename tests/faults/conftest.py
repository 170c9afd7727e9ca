"""Fixtures of the fault suite: private servers per test module, a whole Ladder per test.

Each test module gets its own Redis, RabbitMQ node and MariaDB (:mod:`tests.faults.servers`),
started once for the module (RabbitMQ takes about 5 s) and removed at its end, failed or not.
Each test still has its own key prefix, broker prefix and database on them, and its own four
service processes under supervisord (:class:`FaultStack`). A test that stops a server and fails
before starting it again does not break the next one: every test starts what is not running.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.settings import LadderSettings
from tests.faults.servers import PrivateServers
from tests.faults.stack import FaultStack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.faults)
            # Setup (servers, four processes) and recovery take a while on two cores.
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(240))


@pytest.fixture(scope="module")
def fault_servers() -> Iterator[PrivateServers]:
    servers = PrivateServers()
    try:
        took = servers.start()
        print(f"\nprivate servers up in {took:.1f} s under {servers.root}")
        yield servers
    finally:
        servers.remove()


@pytest.fixture
def servers(fault_servers: PrivateServers) -> PrivateServers:
    """The module's servers, every one of them running at the start of the test."""
    fault_servers.ensure_running()
    return fault_servers


@pytest.fixture
def fault_id() -> str:
    return "f" + uuid.uuid4().hex[:10]


@pytest.fixture
def fault_settings(servers: PrivateServers, fault_id: str) -> LadderSettings:
    return LadderSettings(
        _env_file=None,  # type: ignore[call-arg]
        env="dev",
        redis_url=servers.redis.url,
        amqp_url=servers.rabbitmq.url,
        mysql_url=servers.mariadb.url(f"ladder_{fault_id}"),
        key_prefix=f"lf-{fault_id}",
        broker_prefix=f"lf-{fault_id}",
        merge_interval=0.2,
    )


@pytest.fixture
async def fault_database(fault_settings: LadderSettings) -> str:
    """The test's own database on the private MariaDB, migrated to head. The whole server goes
    with the module, so nothing is dropped."""
    from services.history.migrate import migrate

    await migrate(fault_settings.mysql_url)
    return fault_settings.mysql_url


FAULT_ENV = {
    # Load comes from a few hundred users at a time: no rate limit is the subject here.
    "LADDER_USER_RATE": "1000",
    "LADDER_KEY_RATE": "100000",
    # A relay's unconfirmed entries are taken over soon after a crash.
    "LADDER_RELAY_CLAIM_IDLE_MS": "2000",
    "LADDER_SHUTDOWN_GRACE_SECONDS": "5",
}


@contextlib.contextmanager
def running(settings: LadderSettings, run_dir: Path, **env: str) -> Iterator[FaultStack]:
    """A :class:`FaultStack` with :data:`FAULT_ENV` and ``env`` on top, shut down at the end."""
    ladder = FaultStack(settings, run_dir, extra_env={**FAULT_ENV, **env})
    try:
        ladder.start()
        yield ladder
    finally:
        ladder.shutdown()


@pytest.fixture
def fault_stack(
    fault_settings: LadderSettings, fault_database: str, tmp_path: Path
) -> Iterator[FaultStack]:
    """The four services as processes under supervisord, on the private servers."""
    with running(fault_settings, tmp_path / "run") as ladder:
        yield ladder
