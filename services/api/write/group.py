"""Group commit of single score writes: the concurrent POSTs of one API process share a Redis
round trip (docs/architecture.md, "The write path in detail").

A request hands its prepared ``FCALL`` to :meth:`GroupCommit.write` and awaits its own reply. The
calls gathered meanwhile go to Redis in one pipeline: Redis reads them in one read event and runs
them one after another, each still its own atomic function call with its own idempotency record,
rate buckets and answer, exactly as if sent alone. So grouping changes who pays for the round
trip (the client's connection checkout, packing, socket write and reply parsing; Redis's read and
write system calls), never what a write does.

When a group goes out:

- at once (at the end of the current event-loop turn, so that what that turn gathers goes with
  it) when no group is in flight: a lone request waits for nothing;
- when the group in flight returns, with what gathered meanwhile, if none other is in flight;
- after ``window`` seconds at most, even with groups in flight (at load, so a request never waits
  for more than the window behind the others);
- as soon as ``most`` are waiting, so that one group never holds Redis for long.

With ``LADDER_REDIS_WAIT_REPLICAS`` set, the group's pipeline ends with ``WAIT`` (write/durable.py);
if too few replicas acknowledged it, each write of the group that would be answered 2xx fails with
its 503 instead.

A connection error (Redis down) fails every call of the group with it, as it would have failed
each alone, and the API answers each 503; the error reply of one call (a script error, or Redis
refusing it: read-only after a failover, out of memory, busy) is that call's answer ``FAILED``
only, a 503 as in a batch (write/submit.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
from prometheus_client import Counter
from redis.asyncio import Redis

from services.api.write.durable import Durability
from services.api.write.submit import FAILED

log = structlog.get_logger(__name__)

# Their ratio is the mean group size: how many writes share a round trip.
GROUPS = Counter("ladder_api_write_groups_total", "Redis round trips of single score writes")
GROUPED = Counter("ladder_api_write_grouped_total", "Single score writes sent in those groups")

# The write function's statuses answered 2xx: with too few replicas, answered 503 instead.
ANSWERED_2XX = frozenset({"ok", "duplicate"})

# A waiting call: its FCALL arguments and the future its request awaits.
_Waiting = tuple[list[Any], "asyncio.Future[tuple[str, str]]"]


class GroupCommit:
    """The single writes of one API process, sent to Redis in groups (see the module)."""

    def __init__(
        self, redis: Redis, *, window: float, most: int, durability: Durability | None = None
    ) -> None:
        self._redis = redis
        self._durability = durability or Durability(0, 1)
        self._window = window
        self._most = most
        self._waiting: list[_Waiting] = []
        self._handle: asyncio.Handle | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def durability(self) -> Durability:
        return self._durability

    def write(self, command: list[Any]) -> asyncio.Future[tuple[str, str]]:
        """Send ``FCALL *command`` with the next group; the future of its ``(status, payload)``,
        or of the error that failed it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[str, str]] = loop.create_future()
        self._waiting.append((command, future))
        if self._closed or self._window <= 0 or len(self._waiting) >= self._most:
            self._flush()
        elif self._handle is None:
            # Nothing in flight: go at the end of this turn. Else: when the group in flight
            # returns (see _send), or after the window, whichever comes first.
            self._handle = (
                loop.call_later(self._window, self._flush)
                if self._in_flight
                else loop.call_soon(self._flush)
            )
        return future

    def _flush(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # A request cancelled while it waited (its client went away) writes nothing, as it
        # would not have alone.
        group = [(command, future) for command, future in self._waiting if not future.done()]
        self._waiting = []
        if not group:
            return
        task = asyncio.get_running_loop().create_task(self._send(group))
        self._in_flight.add(task)

    async def _send(self, group: list[_Waiting]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for command, _ in group:
                    pipe.execute_command("FCALL", *command)
                await self._durability.queue(pipe)
                started = time.perf_counter()
                replies: list[Any] = await pipe.execute(raise_on_error=False)
            short = self._durability.shortfall(pipe, replies[len(group) :], started)
        except asyncio.CancelledError:
            for _, future in group:
                future.cancel()
            raise
        except Exception as exc:
            # Redis down or the connection lost: every call of the group fails as it would have
            # alone (whether Redis ran it is as unknown as for a lone call).
            for _, future in group:
                if not future.done():
                    future.set_exception(_each(exc))
        else:
            GROUPS.inc()
            GROUPED.inc(len(group))
            for reply, (_, future) in zip(replies[: len(group)], group, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    log.error("score write failed in Redis", error=str(reply))
                    future.set_result((FAILED, str(reply)))
                elif short is not None and str(reply[0]) in ANSWERED_2XX:
                    future.set_exception(short.again())
                else:
                    future.set_result((str(reply[0]), str(reply[1])))
        finally:
            task = asyncio.current_task()
            self._in_flight.discard(task)
            if self._waiting and not self._in_flight:
                # What gathered while this group was out goes now, without waiting the window.
                self._flush()

    async def drain(self) -> None:
        """Send what is waiting and wait for every group in flight; later writes go alone."""
        self._closed = True
        self._flush()
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)


def _each(exc: Exception) -> Exception:
    """A copy of ``exc`` for each request it fails: an exception raised in many tasks would
    gather every task's traceback."""
    try:
        copy = type(exc)(*exc.args)
    except Exception:
        return exc
    copy.__cause__ = exc.__cause__
    return copy


@contextlib.asynccontextmanager
async def group_commit(
    redis: Redis, *, window: float, most: int, durability: Durability | None = None
) -> AsyncIterator[GroupCommit]:
    """A :class:`GroupCommit` of ``redis``, drained on the way out."""
    writes = GroupCommit(redis, window=window, most=most, durability=durability)
    try:
        yield writes
    finally:
        await writes.drain()
