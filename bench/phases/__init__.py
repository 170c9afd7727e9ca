"""The bench's phases, in the order a run takes them: baselines, single-event POSTs, batch
ingest (and the write path's memory and Redis commands), POST-to-push latency, reads on a board
of a million members, the aggregator's merge, the global view's staleness after a start with a
merge backlog (on a private stack of its own), MySQL's sizes, then one Redis primary against a
Redis Cluster of three, with and without ``WAIT`` (on private servers of its own), and last what
Ladder spends idle, with the bench's boards and with a thousand more. Each is a
function of the running Ladder that returns its rows; ``bench/__main__.py`` runs them and
:mod:`bench.report` keeps what they found.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from bench.probes import Ladder
from bench.settings import BenchSettings

# The key prefix of what the bench writes in Redis outside Ladder's boards (the baseline loop's
# keys, the merge's boards); removed at the start and the end of a run.
BENCH_PREFIX = "ladder-bench"


@dataclass(frozen=True)
class Bench:
    """What every phase measures against: the Ladder under test and the run's settings."""

    ladder: Ladder
    options: BenchSettings

    @property
    def redis(self) -> Redis:
        return self.ladder.redis

    @property
    def seconds(self) -> float:
        return self.options.seconds

    @property
    def workers(self) -> int:
        return self.ladder.settings.api_workers
