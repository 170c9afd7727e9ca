"""Wait until every Ladder service answers ``/readyz`` with 200, or fail after a deadline.

Ports come from the same ``LADDER_*`` settings the services read; or the URLs to wait for are
given as arguments (``make cluster-up``, whose processes each have their own port).
``--api-url`` prints the API's base URL from those settings instead.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

from shared.settings import load_settings


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def api_url() -> str:
    """The API's base URL from the settings (the environment, then ``.env``), as `make up` and
    `make demo` print it."""
    settings = load_settings()
    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host
    return f"http://{host}:{settings.api_port}"


def service_urls() -> dict[str, str]:
    """The ``/readyz`` of each service of ``make up``, from the settings."""
    settings = load_settings()
    api_host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host
    ops_host = "127.0.0.1" if settings.ops_host in ("0.0.0.0", "::") else settings.ops_host
    urls = {
        "api": f"http://{api_host}:{settings.api_port}/readyz",
        "aggregator": f"http://{ops_host}:{settings.aggregator_port}/readyz",
        "history": f"http://{ops_host}:{settings.history_port}/readyz",
        "notifier": f"http://{ops_host}:{settings.notifier_port}/readyz",
    }
    return urls


def main(urls: dict[str, str], deadline_seconds: float = 90.0) -> int:
    waiting = dict(urls)
    deadline = time.monotonic() + deadline_seconds
    while waiting and time.monotonic() < deadline:
        for name, url in list(waiting.items()):
            if ready(url):
                print(f"  {name:<15} ready  {url}")
                del waiting[name]
        if waiting:
            time.sleep(0.5)
    if waiting:
        print(f"not ready after {deadline_seconds:.0f} s: {', '.join(waiting)}", file=sys.stderr)
        print("see `make ps` (`make cluster-ps`) and the services' logs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    given = sys.argv[1:]
    if given == ["--api-url"]:
        print(api_url())
        sys.exit(0)
    sys.exit(main({url.split("/")[2]: url for url in given} if given else service_urls()))
