"""Logs are JSON lines naming their service, and never carry a credential."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.stack import ROOT

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
    assert line["message"].endswith('"WebSocket /v1/ws?token=[redacted]&x=1" [accepted]')
