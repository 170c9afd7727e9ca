"""`make rebuild` (``python -m services.rebuild``) against a server it cannot use: one JSON line
naming the setting to look at, with no address or password, and status 1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

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
