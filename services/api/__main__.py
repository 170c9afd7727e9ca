"""``python -m services.api``: serve the API with uvicorn (uvloop, httptools); see ``server.py``
for how it stops."""

from __future__ import annotations

import contextlib
import sys

from uvicorn.config import STARTUP_FAILURE

from services.api.server import build_server
from shared.logs import configure
from shared.settings import load_settings


def main() -> None:
    settings = load_settings()
    configure("api", settings.log_level)
    server = build_server(settings)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)


if __name__ == "__main__":
    main()
