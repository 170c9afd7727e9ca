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


# Groups that are not Ladder or the engines it runs on: what the load generator, the bench and
# the rest of the machine spent. They are listed, but not in the figure judged against the CPU
# targets in BENCHMARKS.md (Ladder's processes and its Redis, RabbitMQ and MariaDB).
OUTSIDE = ("wrk", "the bench itself", "other")


def ladder_per_event(totals: dict[str, float], events: int) -> float:
    """µs of CPU an event that Ladder's processes and engines spent (all groups but OUTSIDE)."""
    return sum(s for name, s in totals.items() if name not in OUTSIDE) / events * 1e6


def per_event(totals: dict[str, float], events: int) -> str:
    """``1,580 µs: API 1,100 µs, Redis 480 µs, ...; outside Ladder: other 9 µs``: Ladder's CPU
    per event (ladder_per_event), then each group's, largest first, those OUTSIDE last."""

    def listed(inside: bool) -> str:
        ranked = sorted(totals.items(), key=lambda item: -item[1])
        return ", ".join(
            f"{name} {seconds / events * 1e6:,.0f} µs"
            for name, seconds in ranked
            if seconds > 0 and (name not in OUTSIDE) == inside
        )

    outside = listed(False)
    tail = f"; outside Ladder: {outside}" if outside else ""
    return f"{ladder_per_event(totals, events):,.0f} µs: {listed(True)}{tail}"
