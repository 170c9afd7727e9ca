"""CPU time by process over a load phase, read from ``/proc``: where each event's CPU goes.

On a machine whose cores everything shares, this is the evidence of what bounds a throughput:
the CPU a second of every process, divided by the events that went through. Processes are
grouped by what they run; anything else on the machine is counted under ``other``.
"""

from __future__ import annotations

import os
from pathlib import Path

# (group, a substring of the command line), the first match wins.
GROUPS = (
    ("API", "services.api"),
    ("API", "multiprocessing.spawn"),
    ("aggregator", "services.aggregator"),
    ("history", "services.history"),
    ("notifier", "services.notifier"),
    ("Redis", "redis-server"),
    ("RabbitMQ", "beam.smp"),
    ("MariaDB", "mariadbd"),
    ("MariaDB", "mysqld"),
    ("wrk", "wrk"),
    ("the bench itself", "-m bench"),
)
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _group(command: str) -> str:
    return next((name for name, part in GROUPS if part in command), "other")


def snapshot() -> dict[int, tuple[str, float]]:
    """Every process's group and CPU seconds (user + system) so far."""
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(entry.name)] = (_group(command), (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each group spent between two snapshots (processes that ended in between are
    lost; those that started count from zero)."""
    totals: dict[str, float] = {}
    for pid, (group, seconds) in after.items():
        earlier = before.get(pid)
        base = earlier[1] if earlier is not None and earlier[0] == group else 0.0
        totals[group] = totals.get(group, 0.0) + max(0.0, seconds - base)
    return totals


def per_event(totals: dict[str, float], events: int) -> str:
    """``API 1,100 µs, Redis 480 µs, ...``: the groups' CPU per event, largest first."""
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    parts = [f"{name} {seconds / events * 1e6:,.0f} µs" for name, seconds in ranked if seconds > 0]
    total = sum(totals.values()) / events * 1e6
    return f"{total:,.0f} µs: " + ", ".join(parts)
