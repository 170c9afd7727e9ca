"""A message with an event that fails the schema (shared/consumer.py, shared/events.py), through
a real broker: its other events are handled with the batch, the message is dead-lettered whole
while the messages after it are acked, and a replay of it doubles nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from prometheus_client import REGISTRY
from pydantic import ValidationError

from shared.amqp import connect as connect_broker
from shared.consumer import ConsumerRunner
from shared.events import ScoreAccepted, ScoreMessage, message_body, split_message, why_invalid
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import accepted_event as accepted
from tests.helpers import consuming as runner_consuming

WAIT = 15.0
# Long enough for the two messages of a test to be taken in one batch.
WINDOW_MS = 1_000


class Store:
    """An idempotent handler: keeps each event once by its event_id, and counts how many times
    each was handed over and the batches it was handed."""

    def __init__(self) -> None:
        self.kept: dict[str, ScoreAccepted] = {}
        self.handed: Counter[str] = Counter()
        self.batches: list[list[str]] = []
        self._progress = asyncio.Condition()

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        async with self._progress:
            self.batches.append([e.event_id for e in events])
            for event in events:
                self.kept.setdefault(event.event_id, event)
                self.handed[event.event_id] += 1
            self._progress.notify_all()

    async def wait_handed(self, event_id: str, times: int) -> None:
        async with asyncio.timeout(WAIT), self._progress:
            await self._progress.wait_for(lambda: self.handed[event_id] >= times)


@contextlib.asynccontextmanager
async def consuming(
    settings: LadderSettings, broker: Topology, store: Store
) -> AsyncIterator[None]:
    """A history runner whose batch takes its whole window, consuming before the test publishes
    (else the queue would hand over what was published before all at once)."""
    runner = ConsumerRunner(
        name="history",
        amqp_url=settings.amqp_url,
        topology=broker,
        handler=store,
        flush_ms=WINDOW_MS,
        idle_gap=None,
    )
    async with runner_consuming(runner, WAIT):
        yield


async def publish(channel: AbstractChannel, broker: Topology, body: bytes) -> None:
    exchange = await channel.get_exchange(broker.scores_exchange)
    await exchange.publish(aio_pika.Message(body, message_id=uuid.uuid4().hex), routing_key="")


async def next_dead(channel: AbstractChannel, broker: Topology) -> AbstractIncomingMessage:
    """The next message of history's ``.dead`` queue, taken (acked)."""
    queue = await channel.declare_queue(broker.dead_queue("history"), passive=True)
    async with asyncio.timeout(WAIT):
        # Polling: a basic.get has nothing to wait on.
        while (message := await queue.get(fail=False, no_ack=True)) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return message


async def left_in(channel: AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.message_count or 0)


def nested(levels: int) -> object:
    value: object = "deep"
    for _ in range(levels):
        value = {"a": value}
    return value


def good(event_id: str) -> str:
    return accepted(event_id, user_id=f"u-{event_id}").model_dump_json()


def bad(event_id: str, failure: str) -> str:
    """An event as the relay sends it, but for one thing the schema refuses: a value out of
    range, or metadata nested deeper than the consumers' parser reads (about 200 levels)."""
    event = json.loads(good(event_id))
    if failure == "value":
        event["value"] = MAX_SCORE + 1
    else:
        event["metadata"] = nested(250)
    return json.dumps(event)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"consumer": "history", **labels}) or 0.0


@pytest.mark.parametrize("failure", ["value", "metadata"])
async def test_an_event_failing_the_schema_costs_its_message_nothing_else(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel, failure: str
) -> None:
    split_before = sample("ladder_consumer_messages_total", outcome="poison-split")
    refused_before = sample("ladder_consumer_events_refused_total", reason="schema")
    three = message_body([good("e-1"), bad("e-2", failure), good("e-3")])
    store = Store()

    async with consuming(settings, broker, store):
        # Both in one batch: the first is dead-lettered, the one after it acked.
        await publish(channel, broker, three)
        await publish(channel, broker, message_body([good("e-4")]))
        dead = await next_dead(channel, broker)
        await store.wait_handed("e-4", 1)
    # Stopped: a message left unacked would be back in the queue.
    assert await left_in(channel, broker.queue("history")) == 0

    # The good events of the message went through with the batch.
    assert store.batches == [["e-1", "e-3", "e-4"]]
    # The message, whole, dead-lettered at once, and only it.
    assert dead.body == three
    assert dead.headers["x-first-death-reason"] == "rejected"
    assert await left_in(channel, broker.dead_queue("history")) == 0
    assert sample("ladder_consumer_messages_total", outcome="poison-split") == split_before + 1
    assert sample("ladder_consumer_events_refused_total", reason="schema") == refused_before + 1

    # Its cause fixed (or not), the operator publishes it again: the good events are handed
    # over again, stored once, and the message is dead-lettered again for the bad one.
    async with consuming(settings, broker, store):
        await publish(channel, broker, dead.body)
        again = await next_dead(channel, broker)
        await store.wait_handed("e-3", 2)
    assert again.body == three
    assert store.handed == {"e-1": 2, "e-3": 2, "e-4": 1}
    assert sorted(store.kept) == ["e-1", "e-3", "e-4"]
    assert await left_in(channel, broker.queue("history")) == 0


async def test_a_message_of_events_all_failing_the_schema_is_dead_lettered_at_once(
    settings: LadderSettings, broker: Topology, channel: AbstractChannel
) -> None:
    body = message_body([bad("e-1", "value"), bad("e-2", "metadata")])
    store = Store()
    async with consuming(settings, broker, store):
        await publish(channel, broker, body)
        await publish(channel, broker, message_body([good("e-3")]))
        dead = await next_dead(channel, broker)
        await store.wait_handed("e-3", 1)
    assert dead.body == body
    assert store.batches == [["e-3"]]
    assert await left_in(channel, broker.queue("history")) == 0


class Refusing(Store):
    """A handler that refuses (not an outage) every batch holding ``e-3``."""

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        if any(e.event_id == "e-3" for e in events):
            raise ValueError("e-3 refused")
        await super().__call__(events)


async def test_a_message_whose_other_events_the_handler_refuses_is_requeued_as_any_other(
    settings: LadderSettings, broker: Topology
) -> None:
    """Its valid events not all handled, the message is not dead-lettered at once: it goes
    back to the queue toward the delivery limit (1 here), as a refused message does."""
    topology = Topology(prefix=settings.broker_prefix, delivery_limit=1)
    body = message_body([good("e-1"), bad("e-2", "value"), good("e-3")])
    store = Refusing()
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await topology.declare(channel)
        async with consuming(settings, topology, store):
            await publish(channel, topology, body)
            await publish(channel, topology, message_body([good("e-4")]))
            dead = await next_dead(channel, topology)
            await store.wait_handed("e-4", 1)
        assert await left_in(channel, topology.queue("history")) == 0
    assert dead.body == body
    assert dead.headers["x-first-death-reason"] == "delivery_limit"
    # Handled on each of its two deliveries; e-3 never.
    assert store.handed == {"e-1": 2, "e-4": 1}


def test_a_body_is_split_only_with_the_envelope_of_a_known_schema() -> None:
    event = good("e-1")
    assert split_message(b"{not json") is None
    assert split_message(b'{"schema":2,"events":[' + event.encode() + b"]}") is None
    assert split_message(b'{"schema":1,"events":[]}') is None
    assert split_message(b'{"schema":1,"events":[' + event.encode() + b'],"more":1}') is None
    assert split_message(b'{"events":[' + event.encode() + b"]}") is None


def test_a_split_reads_each_event_alone_and_names_the_refused() -> None:
    split = split_message(message_body([good("e-1"), bad("e-2", "value"), "7", good("e-3")]))
    assert split is not None
    valid, refused = split
    assert [e.event_id for e in valid] == ["e-1", "e-3"]
    assert [(r.board_id, r.event_id) for r in refused] == [("main", "e-2"), (None, None)]
    assert "less_than_equal" in str(refused[0].errors)
    # The log gets what failed, not the event's own data.
    assert "input" not in str(refused[0].errors)


def test_the_validation_errors_logged_are_json_a_log_tool_reads() -> None:
    """The poison and schema-refusal lines carry the errors as JSON (each one's loc, msg and
    type); they carried Python's repr of pydantic's list, quotes and tuples, in one string."""
    split = split_message(message_body([good("e-1"), bad("e-2", "value")]))
    assert split is not None
    refused = split[1][0].errors
    assert isinstance(refused, list)
    assert json.loads(json.dumps(refused)) == refused
    assert refused[0]["loc"] == ["value"]
    assert refused[0]["type"] == "less_than_equal"
    with pytest.raises(ValidationError) as caught:
        ScoreMessage.model_validate_json(b'{"schema": 1}')
    poison = why_invalid(caught.value)
    assert isinstance(poison, list)
    assert json.loads(json.dumps(poison)) == poison
    assert {tuple(e) for e in poison} == {("loc", "msg", "type")}
