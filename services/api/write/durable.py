"""Durability across a failover: a score write answered 2xx only once replicas hold it
(``LADDER_REDIS_WAIT_REPLICAS``; docs/operations.md, "On a Redis Cluster").

Redis replicates asynchronously: a primary answers a write before its replicas have it, and a
replica promoted after the primary is lost lacks what the primary had not sent yet, the outbox
entries of accepted events among it. With ``replicas`` > 0 every pipeline of score writes ends
with ``WAIT replicas timeout_ms`` on the connection of the writes (on a cluster, one on each
primary that takes some of them), and the writes are answered only if each ``WAIT`` counts
enough replicas. Otherwise :class:`ReplicasBehind` (503, ``Retry-After``): the writes are stored
on the primary, and a retry of the same event is its duplicate, answered once a ``WAIT`` counts
enough replicas again.

``WAIT`` counts the replicas holding everything its own connection wrote. A duplicate writes
nothing, and the event's first write may have gone on another connection: so a duplicate's
answer is confirmed by a write of its own first (:meth:`Keys.replicated_mark`, a string that
expires within seconds), then ``WAIT``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram
from redis.asyncio import Redis

from services.api.errors import Unavailable
from shared.keys import Keys
from shared.redis_cluster import LadderClusterPipeline
from shared.settings import LadderSettings

WAIT_SECONDS = Histogram(
    "ladder_api_redis_wait_seconds",
    "Redis round trips of score writes ending with WAIT: the writes and the WAIT, send to reply",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
SHORT_WAITS = Counter(
    "ladder_api_redis_wait_short_total",
    "WAITs after score writes that counted fewer replicas than asked within the timeout",
)
# How long the mark of a duplicate's confirmation lives: long enough for its WAIT.
MARK_TTL_MS = 10_000


class ReplicasBehind(Unavailable):
    """Fewer replicas than ``LADDER_REDIS_WAIT_REPLICAS`` acknowledged a write in time."""

    def __init__(self, asked: int, counted: int, retry_after: int) -> None:
        super().__init__(
            f"The write is stored on the Redis primary but only {counted} of the {asked} "
            f"replicas asked for acknowledged it in time; retry with the same event_id, "
            f"which is answered as its duplicate once replicas hold it.",
            retry_after,
        )
        self.asked = asked
        self.counted = counted
        self.retry_after = retry_after

    def again(self) -> ReplicasBehind:
        """The same problem for another request (an exception raised in many tasks would
        gather every task's traceback)."""
        return ReplicasBehind(self.asked, self.counted, self.retry_after)


@dataclass(frozen=True, slots=True)
class Durability:
    """How many replicas must acknowledge a score write before it is answered."""

    replicas: int
    timeout_ms: int

    @classmethod
    def of(cls, settings: LadderSettings) -> Durability:
        return cls(settings.redis_wait_replicas, settings.redis_wait_timeout_ms)

    @property
    def waits(self) -> bool:
        return self.replicas > 0

    async def queue(self, pipe: Any) -> int:
        """Queue the ``WAIT`` (or, on a cluster, one per primary) after the writes queued in
        ``pipe``; the number queued, whose replies end the pipeline's."""
        if not self.waits:
            return 0
        if isinstance(pipe, LadderClusterPipeline):
            return await pipe.queue_waits(self.replicas, self.timeout_ms)
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
        return 1

    def shortfall(self, pipe: Any, acks: list[Any], started: float) -> ReplicasBehind | None:
        """What the ``WAIT`` replies ``acks`` of ``pipe`` (run from ``started``, a
        ``time.perf_counter()``) say of its writes: None if every one is held by enough
        replicas, else the problem to answer them with."""
        if not self.waits:
            return None
        WAIT_SECONDS.observe(time.perf_counter() - started)
        # A WAIT that failed (its node lost) counts none.
        counts = [ack if isinstance(ack, int) else 0 for ack in acks]
        counted = min(counts, default=0)
        covered = not isinstance(pipe, LadderClusterPipeline) or pipe.waits_cover()
        if counts and counted >= self.replicas and covered:
            return None
        SHORT_WAITS.inc()
        return ReplicasBehind(self.replicas, counted, self.retry_after)

    @property
    def retry_after(self) -> int:
        return max(1, math.ceil(self.timeout_ms / 1000))

    async def confirm(self, redis: Redis, keys: Keys, board_id: str) -> None:
        """Raise :class:`ReplicasBehind` unless enough replicas of ``board_id``'s primary hold
        everything it holds now: a duplicate's answer (see the module)."""
        if not self.waits:
            return
        started = time.perf_counter()
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.replicated_mark(board_id), "1", px=MARK_TTL_MS)
            queued = await self.queue(pipe)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for reply in replies[:-queued]:
            if isinstance(reply, Exception):
                raise reply
        problem = self.shortfall(pipe, replies[-queued:], started)
        if problem is not None:
            raise problem
