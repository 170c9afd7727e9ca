"""scripts/wait_ready.py, which `make up`, `make demo` and `make cluster-up` run: its command line,
and the addresses it waits on, taken from the same settings the services listen by."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scripts.wait_ready import api_url, main, service_urls
from tests.stack import ROOT, run

SCRIPT = "scripts/wait_ready.py"
PLAIN = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}


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


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


class _ReadyOnIPv6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.fixture
def ready_on_ipv6_loopback() -> Iterator[int]:
    """A port of ::1 where every /readyz answers 200, as four ready services would."""
    server = _ReadyOnIPv6(("::1", 0), _Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_services_listening_on_an_ipv6_address_are_waited_for_there(
    ready_on_ipv6_loopback: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # ::1 is a host the services listen on (LADDER_API_HOST, LADDER_OPS_HOST); a URL writes it
    # in brackets, or its colons are taken for the port's.
    monkeypatch.chdir(tmp_path)  # no .env but the test's
    port = str(ready_on_ipv6_loopback)
    for name in ("API", "AGGREGATOR", "HISTORY", "NOTIFIER"):
        monkeypatch.setenv(f"LADDER_{name}_PORT", port)
    monkeypatch.setenv("LADDER_API_HOST", "::1")
    monkeypatch.setenv("LADDER_OPS_HOST", "::1")
    assert api_url() == f"http://[::1]:{port}"
    assert main(service_urls(), deadline_seconds=5) == 0
