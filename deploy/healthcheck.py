"""The Ladder image's health command: exit 0 when the service this container runs answers
200 on its /readyz, 1 otherwise.

The image runs any of the four services, each on its own port (the API on LADDER_API_PORT,
8000; the aggregator, history and notifier on LADDER_AGGREGATOR_PORT, LADDER_HISTORY_PORT and
LADDER_NOTIFIER_PORT, 9101 to 9103). The one to ask is the one this container listens on,
read from the kernel's socket table (the container has a network namespace of its own), so
the same command serves every service. Standard library only; nothing of Ladder is imported.
"""

from __future__ import annotations

import os
import sys
import urllib.request

PORTS = {
    "LADDER_API_PORT": 8000,
    "LADDER_AGGREGATOR_PORT": 9101,
    "LADDER_HISTORY_PORT": 9102,
    "LADDER_NOTIFIER_PORT": 9103,
}
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    if fields[3] == LISTEN:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except FileNotFoundError:
            continue
    return ports


def main() -> int:
    wanted = [int(os.environ.get(name, default)) for name, default in PORTS.items()]
    listening = listening_ports()
    ports = [port for port in wanted if port in listening]
    if not ports:
        print(f"no Ladder service listens yet (on any of {wanted})", file=sys.stderr)
        return 1
    url = f"http://127.0.0.1:{ports[0]}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=4) as answer:
            return 0 if answer.status == 200 else 1
    except OSError as exc:  # URLError and HTTPError (a 503) among them
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
