"""scripts/wait_ready.py, which `make up`, `make demo` and `make cluster-up` run: its command line,
and the addresses it waits on, taken from the same settings the services listen by."""

from __future__ import annotations

import sys

import pytest

from tests.stack import run

SCRIPT = "scripts/wait_ready.py"
PLAIN = {"PATH": "/usr/bin:/bin"}


def test_help_prints_the_usage() -> None:
    done = run([sys.executable, SCRIPT, "--help"], env=PLAIN)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: scripts/wait_ready.py")
    assert "--api-url" in done.stdout


@pytest.mark.parametrize("argument", ["127.0.0.1:8000", "--wait=5"])
def test_an_argument_that_is_no_url_is_refused_in_one_line(argument: str) -> None:
    done = run([sys.executable, SCRIPT, argument], env=PLAIN)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("scripts/wait_ready.py: error:")
