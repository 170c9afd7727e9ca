"""The settings a service of ``make up`` starts with (scripts/service_env.py, README.md
"Configuration"): the caller's ``LADDER_*`` variables of the ``make up``, ``make start`` or
``make restart`` that started it, whatever supervisord's own environment holds; a variable the
caller no longer sets is gone at the next restart; ``make down`` forgets them.

The script alone first (quick), then the Makefile's targets on a Ladder of the test's own: its
run directory, free ports, prefixes and database (``stack``), so that a running ``make up`` is
never touched."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from shared.settings import LadderSettings
from shared.topology import Topology
from tests.stack import ROOT, SERVICES, Stack, run

SCRIPT = str(ROOT / "scripts/service_env.py")
PLAIN = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def service_env(run_dir: Path, env: dict[str, str], *args: str) -> str:
    done = run(
        [sys.executable, SCRIPT, *args], env={**PLAIN, "LADDER_RUN_DIR": str(run_dir), **env}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


PRINT_LADDER = (
    "import json, os; "
    "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('LADDER_')}))"
)


def started_with(run_dir: Path, service: str, supervisord_env: dict[str, str]) -> dict[str, str]:
    """The ``LADDER_*`` environment a program of ``service`` starts with under a supervisord
    whose environment is ``supervisord_env``."""
    out = service_env(run_dir, supervisord_env, "run", service, "-c", PRINT_LADDER)
    found: dict[str, str] = json.loads(out)
    return found


def test_a_service_starts_with_what_was_recorded_for_it_not_supervisord_s_environment(
    tmp_path: Path,
) -> None:
    first = {"LADDER_LOG_LEVEL": "INFO", "LADDER_SERVER_KEYS": "old-key"}
    # Recorded at the first make up: supervisord's environment and the record agree.
    assert service_env(tmp_path, first, "write", "--changed", *SERVICES).split() == list(SERVICES)
    path = tmp_path / "env" / "notifier.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it may hold keys
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == first  # LADDER_RUN_DIR is not recorded

    # make restart SERVICE=notifier with a setting more and one less: notifier alone gets them.
    later = {"LADDER_LOG_LEVEL": "DEBUG", "LADDER_ALLOWED_LATENESS": "30"}
    assert service_env(tmp_path, later, "write", "--changed", "notifier").split() == ["notifier"]
    supervisord = {**first, "LADDER_ROOT": str(ROOT), "LADDER_PYTHON": sys.executable}
    assert started_with(tmp_path, "notifier", supervisord) == {
        **later,
        "LADDER_ROOT": str(ROOT),
        "LADDER_PYTHON": sys.executable,
        "LADDER_RUN_DIR": str(tmp_path),
    }
    # The others keep theirs (a crash restarts them with the same).
    assert started_with(tmp_path, "api", supervisord)["LADDER_SERVER_KEYS"] == "old-key"

    # The same settings again: nothing changed.
    assert service_env(tmp_path, later, "write", "--changed", "notifier") == ""
    # None recorded (supervisord started by hand): its environment goes through as it is.
    assert started_with(tmp_path, "sim", supervisord)["LADDER_SERVER_KEYS"] == "old-key"


def test_the_script_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    done = run([sys.executable, SCRIPT, "write"], env={**PLAIN, "LADDER_RUN_DIR": str(tmp_path)})
    assert done.returncode != 0 and "service_env.py write" in done.stderr
    done = run([sys.executable, SCRIPT, "write", "api"], env=PLAIN)
    assert done.returncode != 0 and "LADDER_RUN_DIR is not set" in done.stderr


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k.startswith("LADDER_")}


class MadeStack(Stack):
    """A :class:`Stack` run through the Makefile's targets, ``make up`` included."""

    def make_with(self, *args: str, **settings: str) -> str:
        env = {**self.env, "VENV": sys.prefix, **settings}
        done = run(["make", "-s", "--no-print-directory", *args], env=env, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"make {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def pid(self, service: str) -> int:
        words = self.ctl("status", service).split()
        assert words[1] == "RUNNING", words
        return int(words[3].rstrip(","))


@pytest.fixture
def made(
    settings: LadderSettings, redis: Redis, broker: Topology, tmp_path: Path
) -> Iterator[MadeStack]:
    ladder = MadeStack(settings, tmp_path / "run")
    try:
        yield ladder
    finally:
        ladder.shutdown()


@pytest.mark.stack
@pytest.mark.timeout(300)
def test_settings_given_to_make_up_start_and_restart_reach_the_services(
    made: MadeStack, mysql_database: str
) -> None:
    made.make_with("up")
    pids = {service: made.pid(service) for service in SERVICES}
    assert "LADDER_LOG_LEVEL" not in environ_of(pids["notifier"])
    assert environ_of(pids["api"])["LADDER_API_PORT"] == str(made.ports["api"])

    # A setting given to make restart reaches the restarted service, and it alone.
    made.make_with("restart", "SERVICE=notifier", LADDER_LOG_LEVEL="DEBUG")
    notifier = made.pid("notifier")
    assert notifier != pids["notifier"]
    assert environ_of(notifier)["LADDER_LOG_LEVEL"] == "DEBUG"
    assert made.pid("api") == pids["api"]
    assert "LADDER_LOG_LEVEL" not in environ_of(pids["api"])

    # Not given at the next restart: gone, not kept from the last one.
    made.make_with("restart", "SERVICE=notifier")
    assert "LADDER_LOG_LEVEL" not in environ_of(made.pid("notifier"))

    # make stop, then make start with a setting: the started service has it.
    made.make_with("stop", "SERVICE=history")
    made.make_with("start", "SERVICE=history", LADDER_LOG_LEVEL="WARNING")
    assert environ_of(made.pid("history"))["LADDER_LOG_LEVEL"] == "WARNING"
    # make start of one that runs changes nothing, and says so.
    said = made.make_with("start", "SERVICE=history")
    assert "runs already" in said
    assert environ_of(made.pid("history"))["LADDER_LOG_LEVEL"] == "WARNING"

    # A second make up with the same settings as the first restarts only the service whose
    # settings differ (history, started with WARNING); with another, every service.
    before = {service: made.pid(service) for service in SERVICES}
    said = made.make_with("up")
    assert "restarting history" in said, said
    after = {service: made.pid(service) for service in SERVICES}
    assert [s for s in SERVICES if after[s] != before[s]] == ["history"]
    assert "LADDER_LOG_LEVEL" not in environ_of(after["history"])
    made.make_with("up", LADDER_LOG_LEVEL="ERROR")
    for service in SERVICES:
        pid = made.pid(service)
        assert pid != after[service], service
        assert environ_of(pid)["LADDER_LOG_LEVEL"] == "ERROR", service

    # make down forgets them: the next make up starts from the caller's environment alone.
    made.make_with("down")
    assert not (made.run_dir / "env").exists()
    assert not (made.run_dir / "supervisord.pid").exists()
