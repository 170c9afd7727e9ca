"""`make rebuild` (``python -m services.rebuild``) against a server it cannot use: one JSON line
naming the setting to look at, with no address or password, and status 1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db_boards import definitions_lock
from shared.settings import LadderSettings
from tests.stack import ROOT, free_port


@pytest.mark.parametrize("away", ["mysql", "redis"])
def test_a_server_the_rebuild_cannot_use_is_named_by_its_setting(
    settings: LadderSettings, away: str
) -> None:
    port = free_port()
    mysql, redis = make_url(settings.mysql_url), settings.redis_url
    if away == "mysql":
        mysql = mysql.set(password="s3cret", port=port)
    else:
        redis = f"redis://:s3cret@127.0.0.1:{port}/0"
    env = {
        "PATH": "/usr/bin:/bin",
        "LADDER_KEY_PREFIX": settings.key_prefix,
        "LADDER_MYSQL_URL": mysql.render_as_string(hide_password=False),
        "LADDER_REDIS_URL": redis,
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.rebuild", "--wait", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    [line] = [json.loads(text) for text in done.stdout.splitlines()]
    setting = {"mysql": "LADDER_MYSQL_URL", "redis": "LADDER_REDIS_URL"}[away]
    assert setting in line["message"] and line["level"] == "error", line
    assert "s3cret" not in done.stdout and str(port) not in done.stdout


@pytest.mark.parametrize("wait", ["nan", "inf", "-1", "soon"])
def test_a_wait_that_is_not_a_number_of_seconds_is_refused_before_anything_is_opened(
    wait: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.rebuild", "--wait", wait],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "LADDER_REDIS_URL": "redis://127.0.0.1:1/0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--wait" in done.stderr and "not a number of seconds" in done.stderr, done.stderr


# The rebuild as `make rebuild` runs it, but with the definitions lock waited for half a second
# instead of ten (the lock's wait is a default argument, bound when the module was loaded).
SHORT_LOCK_WAIT = """
import functools, sys
import shared.db_boards, shared.restore
shared.restore.definitions_lock = functools.partial(
    shared.db_boards.definitions_lock, wait_seconds=0.5
)
from services.rebuild.main import main
main(sys.argv[1:])
"""


async def test_a_definitions_lock_held_elsewhere_fails_the_rebuild_in_one_line(
    settings: LadderSettings, db: AsyncEngine
) -> None:
    """A board PUT (or an API restoring definitions) holding the lock past the rebuild's wait:
    the rebuild ends with one line saying nothing changed, not a traceback."""
    env = {
        "PATH": "/usr/bin:/bin",
        "LADDER_KEY_PREFIX": settings.key_prefix,
        "LADDER_MYSQL_URL": settings.mysql_url,
        "LADDER_REDIS_URL": settings.redis_url,
        "LADDER_REDIS_CLUSTER": str(settings.redis_cluster).lower(),
    }
    async with definitions_lock(db):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", SHORT_LOCK_WAIT, "--wait", "1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    [line] = [json.loads(text) for text in done.stdout.splitlines()]
    assert line["level"] == "error" and "nothing was changed" in line["message"], line
    assert "changing board definitions" in line["error"], line
