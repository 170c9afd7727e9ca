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
    assert line["message"].endswith('"WebSocket /v1/ws?[redacted]" [accepted]')


@pytest.mark.parametrize(
    "query",
    [
        "?token=eyJhbGciOi.abc.def&x=1",
        "?x=1&%74oken=eyJhbGciOi.abc.def",
        "?tok%65n=eyJhbGciOi.abc.def&t=2",
        "?tokn=dev-server-key",
        "?dev-server-key",
        "?tokn:dev-server-key",
        "?tokn=dev'server-key",
    ],
)
def test_a_socket_s_query_is_redacted_whole(query: str) -> None:
    """A query's names are read decoded (``%74oken`` is ``token``, and authenticates a socket),
    and a misspelt name, or none, still carries the credential meant: the log of a socket's
    handshake carries none of its query."""
    for tail in (" [accepted]", ""):
        message = f'127.0.0.1:5 - "WebSocket /v1/ws{query}"{tail}'
        event = _redact(None, "info", {"message": message})
        assert event["message"] == f'127.0.0.1:5 - "WebSocket /v1/ws?[redacted]"{tail}'


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
