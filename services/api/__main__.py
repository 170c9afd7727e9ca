"""``python -m services.api``: serve the API with uvicorn (uvloop, httptools), in
``LADDER_API_WORKERS`` processes; see ``serving/uvicorn_server.py`` for how it stops and
``serving/workers.py`` for how workers share the port."""

from __future__ import annotations

import sys

from services.api.serving.uvicorn_server import serve
from services.api.serving.workers import run_workers
from shared.logs import configure
from shared.settings import load_settings


def main() -> None:
    settings = load_settings("api")
    configure("api", settings.log_level)
    sys.exit(serve(settings) if settings.api_workers == 1 else run_workers(settings))


if __name__ == "__main__":
    main()
