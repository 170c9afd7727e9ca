"""The history service against real MySQL and RabbitMQ: exactly once, pages, migrations."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractChannel
from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history import main as history_main
from services.history.handlers import HistoryHandler
from services.history.migrate import SchemaNotReady, check_schema, migrate
from shared.consumer import ConsumerRunner
from shared.db import BadCursor, count_events, open_engine, score_events, user_events
from shared.events import ScoreAccepted, message_body
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import T0, in_process, server_statement, sigterm
from tests.helpers import accepted_event as accepted
from tests.stack import free_port

WAIT = 15.0


def counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("ladder_history_events_total", {"outcome": outcome}) or 0.0


async def eventually(condition: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``condition`` until it holds; fail after ``WAIT`` seconds."""
    async with asyncio.timeout(WAIT):
        # Polling: MySQL has no change notification to wait on instead.
        while not await condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


# --- the handler ---------------------------------------------------------------------------


async def test_handler_stores_a_batch(db: AsyncEngine) -> None:
    events = [
        accepted("e-1", value=3),
        accepted("e-2", value=-7, display_name="Ånä 😀 ✓"),
        accepted("e-3", user_id="u-2", display_name=None),
    ]
    await HistoryHandler(db)(events)

    async with db.connect() as conn:
        rows = (await conn.execute(select(score_events).order_by(score_events.c.id))).all()
    assert [(r.event_id, r.user_id, r.value, r.display_name) for r in rows] == [
        ("e-1", "u-1", 3, "Ana"),
        ("e-2", "u-1", -7, "Ånä 😀 ✓"),
        ("e-3", "u-2", 5, None),
    ]
    # Stored as naive UTC, microseconds kept.
    assert rows[0].accepted_at == T0.replace(tzinfo=None)
    assert rows[0].occurred_at == (T0 - timedelta(seconds=1)).replace(tzinfo=None)


async def test_redelivered_batch_stores_nothing_new(db: AsyncEngine) -> None:
    handler = HistoryHandler(db)
    batch = [accepted(f"e-{i}") for i in range(5)]
    inserted, duplicates = counted("inserted"), counted("duplicate")

    await handler(batch)
    await handler(batch)

    assert await count_events(db, "main") == 5
    assert counted("inserted") - inserted == 5
    assert counted("duplicate") - duplicates == 5


async def test_new_and_duplicate_events_in_one_batch(db: AsyncEngine) -> None:
    handler = HistoryHandler(db)
    await handler([accepted("e-1"), accepted("e-2")])
    inserted, duplicates = counted("inserted"), counted("duplicate")

    # e-2 was stored before; e-3 comes twice in the same batch.
    await handler([accepted("e-2"), accepted("e-3"), accepted("e-3", value=99)])

    assert await count_events(db, "main") == 3
    assert await count_events(db, "main", "e-3") == 1
    assert counted("inserted") - inserted == 1
    assert counted("duplicate") - duplicates == 2
    events, _ = await user_events(db, "main", "u-1", 10, None)
    # The first copy of an event wins; a later copy never rewrites it.
    assert {e["event_id"]: e["value"] for e in events}["e-3"] == 5


async def test_event_ids_are_case_sensitive_and_per_board(db: AsyncEngine) -> None:
    await HistoryHandler(db)([accepted("Ab"), accepted("ab"), accepted("ab", board_id="other")])

    assert await count_events(db, "main") == 2
    assert await count_events(db, "other") == 1


async def test_a_large_batch_is_stored_in_chunks(db: AsyncEngine) -> None:
    batch = [accepted(f"e-{i}", accepted_at=T0 + timedelta(microseconds=i)) for i in range(2500)]
    await HistoryHandler(db)(batch)
    await HistoryHandler(db)(batch[-10:])

    assert await count_events(db, "main") == 2500


# --- reading a user's events ---------------------------------------------------------------


async def test_user_events_newest_first_across_pages(db: AsyncEngine) -> None:
    times = [T0 + timedelta(seconds=i) for i in range(6)]
    mine = [accepted(f"e-{i}", accepted_at=at, value=i) for i, at in enumerate(times)]
    # Two events accepted in the same microsecond: the later insert is the newer.
    mine.append(accepted("e-6", accepted_at=times[5], value=6))
    others = [
        accepted("x-1", user_id="u-2", accepted_at=times[3]),
        accepted("x-2", board_id="other", accepted_at=times[3]),
    ]
    await HistoryHandler(db)(mine + others)

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        events, cursor = await user_events(db, "main", "u-1", 3, cursor)
        pages += 1
        seen.extend(e["event_id"] for e in events)
        if cursor is None:
            break
        # Events arriving while a client pages through do not shift its pages.
        if pages == 1:
            await HistoryHandler(db)([accepted("late", accepted_at=times[5] + timedelta(hours=1))])

    assert seen == ["e-6", "e-5", "e-4", "e-3", "e-2", "e-1", "e-0"]
    assert pages == 3


async def test_user_events_shape(db: AsyncEngine) -> None:
    at = T0 + timedelta(microseconds=123_456)
    await HistoryHandler(db)([accepted("e-1", accepted_at=at, value=-4)])

    events, cursor = await user_events(db, "main", "u-1", 50, None)

    assert events == [
        {
            "event_id": "e-1",
            "user_id": "u-1",
            "region": "eu",
            "team_id": "red-wombats",
            "value": -4,
            "subscore": None,
            "metadata": None,
            "occurred_at": "2026-11-29T16:59:59.123Z",
            "accepted_at": "2026-11-29T17:00:00.123Z",
        }
    ]
    assert cursor is None
    assert await user_events(db, "main", "nobody", 50, None) == ([], None)


async def test_a_full_last_page_ends_without_a_cursor(db: AsyncEngine) -> None:
    await HistoryHandler(db)(
        [accepted(f"e-{i}", accepted_at=T0 + timedelta(seconds=i)) for i in range(4)]
    )

    first, cursor = await user_events(db, "main", "u-1", 2, None)
    assert cursor is not None
    second, cursor = await user_events(db, "main", "u-1", 2, cursor)

    assert [e["event_id"] for e in first + second] == ["e-3", "e-2", "e-1", "e-0"]
    assert cursor is None


@pytest.mark.parametrize(
    "cursor",
    ["", "not-base64!", "e30", "W10", "WyJ4IiwgMV0", "WyIyMDI2LTExLTI5VDE3OjAwOjAwIiwgMC41XQ", "ø"],
)
async def test_a_bad_cursor_is_refused(db: AsyncEngine, cursor: str) -> None:
    with pytest.raises(BadCursor):
        await user_events(db, "main", "u-1", 10, cursor)


async def test_limit_is_bounded(db: AsyncEngine) -> None:
    with pytest.raises(ValueError, match="limit"):
        await user_events(db, "main", "u-1", 0, None)


# --- migrations ----------------------------------------------------------------------------


async def test_migrating_again_is_harmless(db: AsyncEngine, settings: LadderSettings) -> None:
    await HistoryHandler(db)([accepted("e-1")])

    await migrate(settings.mysql_url)
    await migrate(settings.mysql_url)

    await check_schema(db)
    assert await count_events(db, "main") == 1


@contextlib.asynccontextmanager
async def scratch_database(settings: LadderSettings, suffix: str) -> AsyncIterator[str]:
    """The URL of a database that this block alone uses, dropped afterwards."""
    base, _, name = settings.mysql_url.rpartition("/")
    try:
        yield f"{base}/{name}_{suffix}"
    finally:
        await server_statement(base, f"DROP DATABASE IF EXISTS `{name}_{suffix}`")


async def test_concurrent_migrations_from_nothing(settings: LadderSettings) -> None:
    async with scratch_database(settings, "c") as url:
        await asyncio.gather(migrate(url), migrate(url), migrate(url))
        async with open_engine(url) as engine:
            await check_schema(engine)
            assert await count_events(engine, "main") == 0


async def test_the_service_refuses_an_unmigrated_database(settings: LadderSettings) -> None:
    async with scratch_database(settings, "u") as url:
        base, _, name = url.rpartition("/")
        await server_statement(base, f"CREATE DATABASE `{name}`")
        async with open_engine(url) as engine:
            with pytest.raises(SchemaNotReady, match="none"):
                await check_schema(engine)


# --- through the broker --------------------------------------------------------------------


async def publish(channel: AbstractChannel, topology: Topology, body: bytes) -> None:
    exchange = await channel.get_exchange(topology.scores_exchange)
    message = aio_pika.Message(
        body,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=uuid.uuid4().hex,
    )
    await exchange.publish(message, routing_key="")


class Recording:
    """The real handler, telling the test each time a batch has been stored."""

    def __init__(self, inner: HistoryHandler) -> None:
        self.inner = inner
        self.handled = 0
        self._progress = asyncio.Condition()

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        await self.inner(events)
        async with self._progress:
            self.handled += len(events)
            self._progress.notify_all()

    async def wait_handled(self, count: int) -> None:
        async with asyncio.timeout(WAIT), self._progress:
            await self._progress.wait_for(lambda: self.handled >= count)


@contextlib.asynccontextmanager
async def consuming(
    settings: LadderSettings, topology: Topology, handler: Recording
) -> AsyncIterator[ConsumerRunner]:
    runner = ConsumerRunner(
        name="history",
        amqp_url=settings.amqp_url,
        topology=topology,
        handler=handler,
        prefetch=settings.consumer_prefetch,
        batch_size=settings.history_batch,
        flush_ms=settings.history_flush_ms,
    )
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        runner.stop()
        await asyncio.wait_for(task, WAIT)


async def test_the_consumer_stores_each_event_once(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel, db: AsyncEngine
) -> None:
    body = message_body([accepted(f"e-{i}").model_dump_json() for i in range(3)])
    handler = Recording(HistoryHandler(db))

    async with consuming(settings, broker, handler):
        await publish(channel, broker, body)
        await handler.wait_handled(3)
        assert await count_events(db, "main") == 3

        # The relay may publish the same events again (a confirm lost in a crash).
        await publish(channel, broker, body)
        await handler.wait_handled(6)
        assert await count_events(db, "main") == 3


async def test_a_poison_message_is_dead_lettered_and_the_stream_flows_on(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel, db: AsyncEngine
) -> None:
    handler = Recording(HistoryHandler(db))

    async with consuming(settings, broker, handler):
        await publish(channel, broker, b"{not json")
        await publish(channel, broker, message_body([accepted("e-1").model_dump_json()]))
        await handler.wait_handled(1)
        assert await count_events(db, "main", "e-1") == 1

    dead = await channel.declare_queue(broker.dead_queue("history"), passive=True)
    async with dead.iterator() as messages:
        async with asyncio.timeout(WAIT):
            message = await anext(messages)
        await message.ack()
    assert message.body == b"{not json"


async def test_an_event_failing_the_schema_costs_the_others_of_its_message_nothing(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel, db: AsyncEngine
) -> None:
    """The middle event of three has a value out of range: the two others are stored, the
    message is dead-lettered whole, and published again from there it stores nothing twice."""
    bad = accepted("e-2").model_dump(mode="json") | {"value": MAX_SCORE + 1}
    body = message_body(
        [accepted("e-1").model_dump_json(), json.dumps(bad), accepted("e-3").model_dump_json()]
    )
    handler = Recording(HistoryHandler(db))
    dead = await channel.declare_queue(broker.dead_queue("history"), passive=True)

    async def dead_letter() -> bytes:
        async with dead.iterator() as messages, asyncio.timeout(WAIT):
            message = await anext(messages)
            await message.ack()
        return message.body

    async with consuming(settings, broker, handler):
        await publish(channel, broker, body)
        await publish(channel, broker, message_body([accepted("e-4").model_dump_json()]))
        await handler.wait_handled(3)
        assert await dead_letter() == body
        # The operator's replay: e-1 and e-3 handled again, e-2 dead-lettered again.
        await publish(channel, broker, body)
        await handler.wait_handled(5)
        assert await dead_letter() == body

    assert [await count_events(db, "main", e) for e in ("e-1", "e-2", "e-3", "e-4")] == [1, 0, 1, 1]


async def test_the_service_is_ready_then_drains_on_sigterm(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel, db: AsyncEngine
) -> None:
    port = free_port()
    service_settings = settings.model_copy(update={"history_port": port})
    async with in_process(history_main.run(service_settings), WAIT) as service:
        await publish(channel, broker, message_body([accepted("e-1").model_dump_json()]))

        async def stored() -> bool:
            return await count_events(db, "main") == 1

        await eventually(stored)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["dependencies"] == {"broker": "up", "redis": "up", "mysql": "up"}

        # Consuming means the service's signal handlers are in place.
        await sigterm(service, WAIT)
