"""``python -m services.api``: serve the API with uvicorn (uvloop, httptools)."""

from __future__ import annotations

import uvicorn

from services.api.main import create_app
from shared.logs import configure
from shared.settings import load_settings


def main() -> None:
    settings = load_settings()
    configure("api", settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        loop="uvloop",
        http="httptools",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        ws_max_size=64 * 1024,
    )


if __name__ == "__main__":
    main()
