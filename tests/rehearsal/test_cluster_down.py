"""``make cluster-down`` stops every process ``make cluster-up`` started, frees every port it
listened on and removes its state (the nodes' data and the history database), and a
``make cluster-up`` after it starts a whole rehearsal again (which the other tests then use)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.rehearsal.conftest import HOST, RABBIT_PORTS, REDIS_PORTS, cluster, wait_whole
from tests.stack import ROOT

pytestmark = pytest.mark.rehearsal

API_PORTS = (8000, 8001)
MANAGEMENT_PORTS = tuple(port + 10000 for port in RABBIT_PORTS)
HEALTH_PORTS = (9111, 9112, 9113, 9121, 9122, 9123)
STATE = Path(os.environ.get("LADDER_CLUSTER_DIR", ROOT / ".run-cluster"))


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((HOST, port)) == 0


def _left_running() -> list[str]:
    """Command lines of the rehearsal's servers still alive (its services run under its
    supervisord, whose children these patterns do not name; their ports say if one is left)."""
    found = subprocess.run(
        ["pgrep", "-a", "-f", r"redis-server 127\.0\.0\.1:70(0[0-5])|ladder-rabbit-567[3-5]@"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return found.stdout.splitlines()


async def _database_exists() -> bool:
    """Whether MariaDB (the server of `make up`, which the rehearsal shares) holds the
    rehearsal's history database, asked without naming it (it may be gone)."""
    server = create_async_engine(f"mysql+asyncmy://root@{HOST}:3306/")
    try:
        async with server.connect() as connection:
            names = await connection.execute(text("SHOW DATABASES LIKE 'ladder_cluster'"))
            return names.first() is not None
    finally:
        await server.dispose()


async def test_cluster_down_leaves_nothing_and_cluster_up_starts_again() -> None:
    ports = (*REDIS_PORTS, *RABBIT_PORTS, *MANAGEMENT_PORTS, *API_PORTS, *HEALTH_PORTS)
    assert all(_listening(port) for port in (*REDIS_PORTS, *RABBIT_PORTS, *API_PORTS))
    assert (STATE / "redis").is_dir() and (STATE / "rabbit").is_dir()
    assert await _database_exists()

    try:
        done = await asyncio.to_thread(
            subprocess.run,
            ["make", "-s", "cluster-down"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr[-4000:]

        assert "not running" in cluster("ps")
        assert [port for port in ports if _listening(port)] == []
        assert _left_running() == []
        assert not (STATE / "supervisord.pid").exists()
        assert not (STATE / "redis").exists() and not (STATE / "rabbit").exists()
        assert not await _database_exists()
    finally:  # whole again for the tests after, whatever this one found
        await asyncio.to_thread(cluster, "up")
        await asyncio.to_thread(wait_whole)
