"""Wait until every Ladder service answers ``/readyz`` with 200, or fail after a deadline.

Ports come from the same ``LADDER_*`` settings the services read; or the URLs to wait for are
given as arguments (``make cluster-up``, whose processes each have their own port).
``--api-url`` prints the API's base URL from those settings instead.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from shared.settings import load_settings
from shared.settings_checks import reachable_host


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
    return f"http://{reachable_host(settings.api_host)}:{settings.api_port}"


def service_urls() -> dict[str, str]:
    """The ``/readyz`` of each service of ``make up``, from the settings."""
    settings = load_settings()
    api_host, ops_host = reachable_host(settings.api_host), reachable_host(settings.ops_host)
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


def parse(argv: list[str] | None = None) -> tuple[bool, dict[str, str]]:
    """Whether to print the API's URL, and the ``/readyz`` URLs given, each by its
    ``host:port``. A URL that is not ``http://host...`` is refused (status 2) with the usage."""
    parser = argparse.ArgumentParser(
        prog="scripts/wait_ready.py",
        description="Wait until every Ladder service answers /readyz with 200 (90 s at most).",
    )
    parser.add_argument(
        "--api-url", action="store_true", help="print the API's base URL from the settings"
    )
    parser.add_argument(
        "urls",
        nargs="*",
        metavar="URL",
        help="a /readyz URL to wait for (default: every service's, from the settings)",
    )
    args = parser.parse_args(argv)
    if args.api_url and args.urls:
        parser.error("--api-url takes no URL")
    given = {}
    for url in args.urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            parser.error(f"{url!r} is not an http:// URL")
        given[parts.netloc] = url
    return args.api_url, given


if __name__ == "__main__":
    print_api_url, given = parse()
    if print_api_url:
        print(api_url())
        sys.exit(0)
    sys.exit(main(given or service_urls()))
