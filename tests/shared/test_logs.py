"""Logs are JSON lines naming their service, and never carry a credential."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shared.logs import _redact
from tests.stack import ROOT, free_port

SCRIPT = """
import logging
from shared.logs import configure
configure("api")
logging.getLogger("uvicorn.error").info(
    '%s - "WebSocket %s" [accepted]', "127.0.0.1:5", "/v1/ws?token=eyJhbGciOi.abc.def&x=1"
)
"""


def test_a_websocket_token_is_redacted_from_the_log() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True
    )
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["service"] == "api"
    assert line["level"] == "info"
    assert "eyJhbGciOi" not in done.stdout
    assert line["message"].endswith('"WebSocket /v1/ws?token=[redacted]&x=[redacted]" [accepted]')


@pytest.mark.parametrize(
    ("query", "redacted"),
    [
        ("?token=eyJhbGciOi.abc.def&x=1", "?token=[redacted]&x=[redacted]"),
        ("?x=1&%74oken=eyJhbGciOi.abc.def", "?x=[redacted]&%74oken=[redacted]"),
        ("?TOKEN=eyJhbGciOi.abc.def", "?TOKEN=[redacted]"),
        ("?tok%65n=eyJhbGciOi.abc.def&t=2", "?tok%65n=[redacted]&t=[redacted]"),
        ("?tokn=dev-server-key", "?tokn=[redacted]"),
    ],
)
def test_a_socket_s_query_is_redacted_however_its_token_is_written(
    query: str, redacted: str
) -> None:
    """A query's names are read decoded (``%74oken`` is ``token``, and authenticates a socket),
    and a misspelt name still carries the credential meant: the log of a socket's handshake
    carries no value of its query."""
    message = f'127.0.0.1:5 - "WebSocket /v1/ws{query}" [accepted]'
    event = _redact(None, "info", {"message": message})
    assert event["message"] == f'127.0.0.1:5 - "WebSocket /v1/ws{redacted}" [accepted]'


def test_outside_a_socket_s_url_only_a_token_is_redacted() -> None:
    message = "broker at amqp://127.0.0.1/?heartbeat=30&token=abc"
    event = _redact(None, "info", {"message": message})
    assert event["message"] == "broker at amqp://127.0.0.1/?heartbeat=30&token=[redacted]"


START = """
import warnings
from shared.logs import configure
from shared.settings import LadderSettings
from services.api.serving.workers import listening
configure("api")
warnings.warn("a library's warning")
listening(LadderSettings(_env_file=None, api_port={port})).close()
"""


def test_what_a_start_says_is_json_too() -> None:
    """The workers' parent binding the port (uvicorn's "running on" line) and Python's warnings
    (PyJWT's on the short development secret): JSON lines on stdout, nothing on stderr."""
    script = START.replace("{port}", str(free_port()))
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert done.stderr == ""
    said = {line["logger"]: line for line in lines}
    assert said["py.warnings"]["level"] == "warning"
    assert "a library's warning" in said["py.warnings"]["message"]
    assert said["uvicorn.error"]["message"].startswith("Uvicorn running on http://")
    assert {line["service"] for line in lines} == {"api"}
