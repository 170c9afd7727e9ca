"""What every fault test checks once the fault is over: the counts.

- Every event the API accepted (2xx) is in the MySQL event log exactly once, and nothing else is:
  an event is its board, user and id (``shared.keys.event_ref``), the load sharing each id
  between two users' events.
- Every regional board of ``main`` (``incr``), all-time, equals the sum of its history: each
  user's score in each region is ``SUM(value)`` of its events there in MySQL, and no board holds
  a user that MySQL does not.
- The merged global view holds, for each user, the sum of its regions.
- Nothing is left behind: the outbox is empty, every queue is drained (nothing ready, nothing
  unacknowledged) with its one consumer back on it, no dead-letter queue holds a message, and
  every consumer's ``/readyz`` answers 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from redis.asyncio import Redis
from sqlalchemy import text

from shared.amqp import connect as connect_broker
from shared.db import open_engine
from shared.keys import Keys, event_ref
from shared.ranking import id_of, score_of
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import CONSUMERS, Topology
from tests.faults.load import Load
from tests.faults.servers import PrivateRabbitMQ, PrivateServer
from tests.faults.stack import FaultStack

T = TypeVar("T")

BOARD = "main"


async def wait_for(
    what: str, probe: Callable[[], Awaitable[T | None]], within: float, every: float = 0.1
) -> T:
    """The first truthy answer of ``probe``; a probe that raises counts as not yet."""
    end = time.monotonic() + within
    last: object = None
    while True:
        try:
            answer = await probe()
            if answer:
                return answer
            last = answer
        except Exception as exc:
            last = repr(exc)
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {within} s (last: {last})")
        await asyncio.sleep(every)


@dataclass
class Stored:
    rows: int
    ids: Counter[str]  # by event_ref: "<event_id>:<user_id>"
    sums: dict[tuple[str, str], int]  # (user, region) -> SUM(value)


async def stored_events(mysql_url: str) -> Stored:
    async with open_engine(mysql_url) as engine, engine.connect() as conn:
        result = await conn.execute(
            text("SELECT event_id, user_id, region, value FROM score_events WHERE board_id = :b"),
            {"b": BOARD},
        )
        rows = result.all()
    sums: dict[tuple[str, str], int] = defaultdict(int)
    for _, user, region, value in rows:
        sums[(user, region)] += int(value)
    return Stored(rows=len(rows), ids=Counter(event_ref(r[0], r[1]) for r in rows), sums=dict(sums))


async def history_complete(settings: LadderSettings, load: Load, within: float) -> Stored:
    """Wait until MySQL holds every accepted event; then the event log must equal them."""
    accepted = set(load.accepted)

    async def complete() -> Stored | None:
        stored = await stored_events(settings.mysql_url)
        return stored if accepted <= stored.ids.keys() else None

    try:
        stored = await wait_for("every accepted event in MySQL", complete, within, every=0.25)
    except AssertionError:
        stored = await stored_events(settings.mysql_url)
        missing = accepted - stored.ids.keys()
        raise AssertionError(
            f"{len(missing)} of {len(accepted)} accepted events never reached MySQL, "
            f"e.g. {sorted(missing)[:5]}"
        ) from None
    doubled = {e: n for e, n in stored.ids.items() if n > 1}
    extra = stored.ids.keys() - accepted
    assert not doubled, f"events stored more than once: {list(doubled.items())[:5]}"
    assert not extra, f"events in MySQL that were never accepted: {sorted(extra)[:5]}"
    assert stored.rows == len(accepted)
    # What MySQL holds is what was sent, value for value.
    sent: dict[tuple[str, str], int] = defaultdict(int)
    for body in load.accepted.values():
        sent[(body["user_id"], body["region"])] += body["value"]
    assert stored.sums == sent
    return stored


async def boards_equal_history(redis: Redis, keys: Keys, stored: Stored) -> int:
    """Each regional all-time board equals the sums of MySQL; returns how many entries matched."""
    by_region: dict[str, dict[str, int]] = defaultdict(dict)
    for (user, region), total in stored.sums.items():
        by_region[region][user] = total
    checked = 0
    for region, expected in by_region.items():
        view = keys.region_view(BOARD, "alltime", "all", region)
        members = await redis.zrange(view, 0, -1, withscores=True)
        actual = {id_of(m): score_of(s, True) for m, s in members}
        wrong = {u: (actual.get(u), t) for u, t in expected.items() if actual.get(u) != t}
        assert not wrong, f"region {region}: (redis, mysql) differ for {list(wrong.items())[:5]}"
        assert actual.keys() == expected.keys(), f"region {region}: users MySQL does not know"
        checked += len(expected)
    return checked


async def global_is_sum_of_regions(
    redis: Redis, keys: Keys, stored: Stored, within: float = 30.0
) -> int:
    """After the aggregator's merge, each user's global score is the sum of its regions."""
    expected: dict[str, int] = defaultdict(int)
    for (user, _), total in stored.sums.items():
        expected[user] += total
    view = keys.global_view(BOARD, "alltime", "all")

    async def merged() -> dict[str, Any] | None:
        members = await redis.zrange(view, 0, -1, withscores=True)
        actual = {id_of(m): score_of(s, True) for m, s in members}
        return {"ok": True} if actual == expected else None

    try:
        await wait_for("global view = sum of regions", merged, within, every=0.25)
    except AssertionError:
        members = await redis.zrange(view, 0, -1, withscores=True)
        actual = {id_of(m): score_of(s, True) for m, s in members}
        wrong = {u: (actual.get(u), t) for u, t in expected.items() if actual.get(u) != t}
        raise AssertionError(
            f"global view differs for {len(wrong)} users (global, sum of regions): "
            f"{list(wrong.items())[:5]}; {len(actual.keys() - expected.keys())} unknown users"
        ) from None
    return len(expected)


async def queue_depths(settings: LadderSettings) -> dict[str, int]:
    """Ready messages of every queue and dead-letter queue of the test's broker prefix."""
    topology = Topology(settings.broker_prefix, settings.delivery_limit)
    depths = {}
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        for consumer in CONSUMERS:
            for name in (topology.queue(consumer), topology.dead_queue(consumer)):
                queue = await channel.declare_queue(name, passive=True)
                depths[name] = int(queue.declaration_result.message_count or 0)
    return depths


@dataclass(frozen=True)
class QueueState:
    messages: int  # ready + unacknowledged
    unacked: int
    consumers: int


def broker_queues(rabbitmq: PrivateRabbitMQ, prefix: str) -> dict[str, QueueState]:
    """The broker's own view of the test's queues: messages (ready and unacknowledged alike)
    and consumers, which AMQP's passive declare does not tell (it counts ready ones only)."""
    out = rabbitmq.ctl(
        "list_queues",
        "-q",
        "--no-table-headers",
        "name",
        "messages",
        "messages_unacknowledged",
        "consumers",
    )
    states = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0].startswith(f"{prefix}."):
            states[fields[0]] = QueueState(*(int(f) for f in fields[1:]))
    return states


async def settled(
    settings: LadderSettings,
    keys: Keys,
    stored: Stored,
    consumer_urls: Iterable[str],
    rabbitmq: PrivateRabbitMQ,
) -> tuple[int, int, dict[str, QueueState]]:
    """The checks after a fault: every regional all-time board equals its history, every global
    view the sum of the regions, and nothing left behind (:func:`nothing_left_behind`). Returns
    the regional and global entries checked, and the queues' state."""
    async with open_redis(settings.redis_url) as redis:
        matched = await boards_equal_history(redis, keys, stored)
        merged = await global_is_sum_of_regions(redis, keys, stored)
        queues = await nothing_left_behind(settings, redis, keys, consumer_urls, rabbitmq)
    return matched, merged, queues


async def nothing_left_behind(
    settings: LadderSettings,
    redis: Redis,
    keys: Keys,
    consumer_urls: Iterable[str],
    rabbitmq: PrivateRabbitMQ,
) -> dict[str, QueueState]:
    """Consumers ready and each consuming its queue again, the outbox empty, every queue drained
    (nothing ready, nothing unacknowledged), nothing dead-lettered."""
    async with httpx.AsyncClient(timeout=5) as client:
        for url in consumer_urls:

            async def ready(url: str = url) -> bool:
                return (await client.get(f"{url}/readyz")).status_code == 200

            await wait_for(f"{url}/readyz 200", ready, 60)

    async def outbox_empty() -> bool:
        return await redis.xlen(keys.outbox(BOARD)) == 0

    await wait_for("outbox empty", outbox_empty, 60)

    topology = Topology(settings.broker_prefix, settings.delivery_limit)
    wanted = {topology.queue(c) for c in CONSUMERS}
    dead = {topology.dead_queue(c) for c in CONSUMERS}

    async def drained() -> dict[str, QueueState] | None:
        states = await asyncio.to_thread(broker_queues, rabbitmq, settings.broker_prefix)
        ok = states.keys() == wanted | dead and all(
            states[q].messages == 0 and states[q].consumers == 1 for q in wanted
        )
        ok = ok and all(states[q].messages == 0 for q in dead)
        return states if ok else None

    try:
        return await wait_for(
            "every queue consumed by one consumer and drained, nothing dead-lettered",
            drained,
            60,
            every=0.5,
        )
    except AssertionError as exc:
        states = await asyncio.to_thread(broker_queues, rabbitmq, settings.broker_prefix)
        raise AssertionError(f"{exc}: {states}") from None


def consumed(queues: dict[str, QueueState]) -> str:
    """``queue: messages/consumers`` of the main queues, for the figures."""
    return (
        ", ".join(
            f"{name.rsplit('.', 1)[-1]} {q.messages}msg/{q.consumers}consumer"
            for name, q in sorted(queues.items())
            if not name.endswith(".dead")
        )
        + f"; dead-lettered {sum(q.messages for n, q in queues.items() if n.endswith('.dead'))}"
    )


async def metric(url: str, name: str) -> float:
    """One sample of a service's ``/metrics`` (0 if absent)."""
    async with httpx.AsyncClient(timeout=5) as client:
        text_ = (await client.get(f"{url}/metrics")).text
    for line in text_.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def figures(name: str, load: Load, stored: Stored | None, **more: object) -> str:
    line = (
        f"FIGURES {name}: sent={load.sent} accepted(2xx)={len(load.accepted)} "
        f"statuses={dict(sorted(load.statuses.items()))} "
        f"stored_in_mysql={stored.rows if stored else '-'} "
        f"distinct_in_mysql={len(stored.ids) if stored else '-'} "
        f"duplicates={(stored.rows - len(stored.ids)) if stored else '-'} "
        f"client_retries={load.retries} duplicate_answers={load.duplicates_answered} "
        f"rate={load.rate:.0f}/s"
    )
    for key, value in more.items():
        line += f" {key}={value}"
    print(line)
    return line


class Sampler:
    """Polls a URL every ``every`` seconds in the background: (monotonic time, status or 0)."""

    def __init__(self, url: str, every: float = 0.2) -> None:
        self.url = url
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    status = (await client.get(self.url)).status_code
                except httpx.HTTPError:
                    status = 0
                self.samples.append((time.monotonic(), status))
                await asyncio.sleep(self.every)

    def between(self, start: float, end: float) -> Counter[int]:
        return Counter(status for at, status in self.samples if start <= at <= end)

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@dataclass
class Outage:
    """When a server was asked to stop, was down, was asked to start, and was up again."""

    stopping: float = 0.0
    down: float = 0.0
    starting: float = 0.0
    up: float = 0.0


@contextlib.asynccontextmanager
async def stopped_under_load(server: PrivateServer, load: Load) -> AsyncIterator[Outage]:
    """300 events of ``load``, then ``server`` stopped for the block, started again once the block
    is done, 300 events more and the load stopped; the times of each step."""
    outage = Outage()
    await load.more(300)
    outage.stopping = time.monotonic()
    await asyncio.to_thread(server.stop)
    outage.down = time.monotonic()
    yield outage
    outage.starting = time.monotonic()
    await asyncio.to_thread(server.start)
    outage.up = time.monotonic()
    await load.more(300)
    await load.stop()


def assert_answered_throughout(
    load: Load, outage: Counter[int], ready_during: Counter[int]
) -> None:
    """Every score was accepted, while the server was down too, and the API stayed ready."""
    assert set(load.statuses) == {200}, load.refused[:5]
    assert outage[200] > 0 and set(outage) == {200}, outage
    assert ready_during and set(ready_during) == {200}, ready_during


async def restarted_while_down(
    fault_stack: FaultStack,
    tag: str,
    stop: Callable[[], None],
    start: Callable[[], None],
    what: str,
) -> None:
    """History is killed while a server it needs is down (``stop``), and supervisord starts it
    again at once. The new process must wait for the server (its ``/readyz`` says 503 meanwhile,
    docs/api.md section 10), not exit: supervisord restarts an exiting program only a few times
    (startretries=3, counted when it dies within startsecs=2) and then leaves it FATAL for good.
    Then ``start``: history must catch up, every accepted event exactly once."""
    settings = fault_stack.settings
    async with Load(fault_stack.api, tag=tag) as load:
        await load.more(200)
        await asyncio.to_thread(stop)
        try:
            os.kill(await asyncio.to_thread(fault_stack.pid, "history"), signal.SIGKILL)
            await load.more(300)

            async def exited() -> list[str]:
                return [e for e in fault_stack.exits() if e.startswith("history: exit status")]

            # Long enough for the restarted history to have met the missing server.
            exits: list[str] = []
            with contextlib.suppress(AssertionError):
                exits = await wait_for("history exits", exited, 15, every=0.25)
            print(
                f"FIGURES history_restarted_while_{what}_down: accepted(2xx) so far="
                f"{len(load.accepted)} history_state={fault_stack.status('history')} "
                f"exits={fault_stack.exits()}"
            )
            assert not exits, f"history exited for want of the {what}: {exits}"
        finally:
            await asyncio.to_thread(start)
        await load.more(300)
        await load.stop()
    await asyncio.to_thread(fault_stack.wait_ready, "history", 60)
    stored = await history_complete(settings, load, within=120)
    figures(f"history_restarted_while_{what}_down", load, stored)
