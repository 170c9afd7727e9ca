"""Free ports on loopback for the private servers that the bench and the tests start."""

from __future__ import annotations

import random
import socket
from collections.abc import Collection

HOST = "127.0.0.1"


def free(port: int) -> bool:
    """Whether nothing listens on ``port`` of loopback now."""
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def consecutive_free(
    count: int,
    low: int,
    high: int,
    *,
    also: Collection[int] = (),
    reserved: Collection[int] = (),
) -> list[int]:
    """``count`` consecutive ports in ``[low, high)``, each free with each port ``also`` above
    it (a Redis node's bus port: 10000), none of them ``reserved``."""
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(low, high - count)
        ports = list(range(base, base + count))
        wanted = ports + [p + offset for p in ports for offset in also]
        if not set(reserved).intersection(wanted) and all(free(p) for p in wanted):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports in {low}-{high}")
