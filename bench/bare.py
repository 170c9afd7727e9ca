"""The bare endpoint baseline: FastAPI on uvicorn with the API's server settings (uvloop,
httptools, no access log, the same number of worker processes), answering the score POST's path
with a constant and doing nothing else.

``python -m bench.bare <port> <workers>``
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

import uvicorn
from fastapi import FastAPI, Response

app = FastAPI()


@app.post("/v1/boards/{board_id}/scores")
async def nothing(board_id: str) -> Response:
    return Response(b'{"ok":true}', media_type="application/json")


@app.get("/healthz")
async def healthz() -> Response:
    return Response(b"{}", media_type="application/json")


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


if __name__ == "__main__":
    uvicorn.run(
        "bench.bare:app",
        host="127.0.0.1",
        port=int(sys.argv[1]),
        workers=int(sys.argv[2]),
        loop="uvloop",
        http="httptools",
        log_config=None,
        access_log=False,
    )
