"""A whole Ladder for one fault test: :class:`tests.stack.Stack` with supervisord's view of each
service (pids, states, the exits it did not ask for)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tests.stack import Stack


@dataclass
class FaultStack(Stack):
    """:class:`tests.stack.Stack` with the process manager's view of each service."""

    def pid(self, service: str) -> int:
        """The pid of a running service, per supervisord; 0 if it is not running."""
        out = self.ctl("pid", service).strip()
        return int(out) if out.isdigit() else 0

    def new_pid(self, service: str, old: int, within: float = 60.0) -> int:
        """Wait for supervisord to have started ``service`` again, under a pid other than
        ``old``."""
        end = time.monotonic() + within
        while time.monotonic() < end:
            pid = self.pid(service)
            if pid and pid != old:
                return pid
            time.sleep(0.1)
        raise TimeoutError(f"{service} not restarted in {within} s: {self.ctl('status')}")

    def status(self, service: str) -> str:
        """supervisord's state of a service: RUNNING, STARTING, BACKOFF, FATAL, ..."""
        fields = self.ctl("status", service).split()
        return fields[1] if len(fields) > 1 else "UNKNOWN"

    def exits(self) -> list[str]:
        """supervisord's record of every service exit it did not ask for: "<service>: <how>"."""
        log = self.run_dir / "logs" / "supervisord.log"
        found = []
        for line in log.read_text().splitlines() if log.exists() else []:
            if " exited: " in line and "not expected" in line:
                what = line.split(" exited: ", 1)[1].removesuffix("; not expected)")
                found.append(what.replace(" (", ": ", 1))
        return found

    def logs(self) -> str:
        return "\n".join(f"--- {s} ---\n{self.log(s)}" for s in ("api", *CONSUMERS))


CONSUMERS = ("aggregator", "history", "notifier")
