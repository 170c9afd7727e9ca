"""The Redis that ``make up`` starts where none runs (scripts/infra.sh's ``start_redis``) keeps
an append-only file: checked by running that very function on a spare port with a run dir of
the test's own, so the machine's Redis on 6379 is never touched."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.stack import ROOT, free_port, run, wait_for

INFRA = str(ROOT / "scripts/infra.sh")

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None or (os.geteuid() != 0 and shutil.which("sudo") is None),
    reason="needs redis-server, and root or sudo as scripts/infra.sh does",
)


def infra(run_dir: Path, port: int, script: str) -> str:
    """``script`` in a bash that sourced scripts/infra.sh with Redis moved to ``port``."""
    env = {**os.environ, "LADDER_RUN_DIR": str(run_dir)}
    prelude = f'source "{INFRA}"; PORT[redis]={port}; REDIS_LOG="{run_dir}/redis.log"; '
    done = run(["bash", "-c", prelude + script], env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def spare(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    port = free_port()
    yield tmp_path / "run", port
    client = redis.Redis(port=port)
    try:
        client.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # stopped already (or never started)
    finally:
        client.close()


def test_the_redis_make_up_starts_keeps_an_append_only_file(spare: tuple[Path, int]) -> None:
    run_dir, port = spare
    args = infra(run_dir, port, 'redis_args; printf "%s\\n" "${REDIS_ARGS[@]}"').splitlines()
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "everysec"
    assert args[args.index("--dir") + 1] == str(run_dir / "redis")

    infra(run_dir, port, "start_redis")
    client = redis.Redis(port=port, decode_responses=True)
    try:
        config = client.config_get("append*")
        assert config["appendonly"] == "yes"
        assert config["appendfsync"] == "everysec"
        assert client.config_get("dir")["dir"] == str(run_dir / "redis")
        client.set("accepted", "kept")
        pid = int(client.info("server")["process_id"])
        # A crash of the process (no shutdown, no save): what was acknowledged is in the file.
        os.kill(pid, signal.SIGKILL)
        wait_for("the killed Redis to go", lambda: not _alive(pid), 10)
    finally:
        client.close()

    infra(run_dir, port, "start_redis")
    client = redis.Redis(port=port, decode_responses=True)
    try:
        deadline = time.monotonic() + 10
        while (value := _get(client)) is None and time.monotonic() < deadline:
            time.sleep(0.05)  # LOADING: the file is replayed before anything answers
    finally:
        client.close()
    assert value == "kept"
    assert list((run_dir / "redis").glob("appendonlydir/*.aof"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _get(client: redis.Redis) -> str | None:
    try:
        value = client.get("accepted")
    except redis.BusyLoadingError:
        return None
    return value if isinstance(value, str) else None
