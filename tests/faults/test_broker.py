"""Broker faults: RabbitMQ stopped under load, and a channel closed before its ack."""

from __future__ import annotations

import uuid

import aio_pika
import httpx
import pytest

from services.history.handlers import HistoryHandler
from shared.amqp import connect as connect_broker
from shared.db import count_events, open_engine
from shared.events import ScoreMessage
from shared.keys import Keys
from shared.redis import open_redis
from tests.faults.checks import (
    BOARD,
    Sampler,
    assert_answered_throughout,
    consumed,
    figures,
    history_complete,
    metric,
    restarted_while_down,
    settled,
    stopped_under_load,
    wait_for,
)
from tests.faults.load import Load
from tests.faults.servers import PrivateServers
from tests.faults.stack import CONSUMERS, FaultStack
from tests.helpers import SERVER

pytestmark = pytest.mark.faults


async def test_broker_stopped_under_load(servers: PrivateServers, fault_stack: FaultStack) -> None:
    """RabbitMQ stops while scores pour in, and starts again: the API keeps answering 200 and
    stays ready, the outbox holds what the broker cannot take, and afterwards every accepted
    event is in MySQL exactly once, every board is the sum of its history, and every consumer
    consumes again."""
    settings = fault_stack.settings
    keys = Keys(settings.key_prefix)
    consumer_urls = [fault_stack.ops(c) for c in CONSUMERS]
    async with (
        open_redis(settings.redis_url) as redis,
        Sampler(f"{fault_stack.api}/readyz") as api_ready,
        Sampler(f"{fault_stack.ops('aggregator')}/readyz") as aggregator_ready,
        Sampler(f"{fault_stack.ops('history')}/readyz") as history_ready,
        Sampler(f"{fault_stack.ops('notifier')}/readyz") as notifier_ready,
        Load(fault_stack.api, tag="rb") as load,
        stopped_under_load(servers.rabbitmq, load) as t,
    ):
        # While it is down: scores are still accepted, into the outbox.
        await load.more(600)

        async def outbox_grew() -> int:
            return int(await redis.xlen(keys.outbox(BOARD)))

        held = await wait_for("the outbox holds events", outbox_grew, 10)

    outage = load.answered_between(t.down, t.starting)
    ready_during = api_ready.between(t.stopping, t.up)
    consumers_during = {
        name: dict(sampler.between(t.down, t.starting))
        for name, sampler in (
            ("aggregator", aggregator_ready),
            ("history", history_ready),
            ("notifier", notifier_ready),
        )
    }
    stored = await history_complete(settings, load, within=120)
    matched, merged, queues = await settled(settings, keys, stored, consumer_urls, servers.rabbitmq)
    figures(
        "broker_stopped",
        load,
        stored,
        broker_down_s=f"{t.starting - t.down:.1f}",
        broker_stop_s=f"{t.down - t.stopping:.1f}",
        broker_start_s=f"{t.up - t.starting:.1f}",
        answered_while_down=dict(outage),
        outbox_held=held,
        api_readyz_while_down=dict(ready_during),
        consumer_readyz_while_down=consumers_during,
        region_entries_checked=matched,
        global_entries_checked=merged,
        queues_after=consumed(queues),
        unexpected_exits=fault_stack.exits(),
    )
    assert_answered_throughout(load, outage, ready_during)


async def test_channel_closed_before_its_ack(fault_stack: FaultStack) -> None:
    """A delivery taken and never acknowledged comes back, and has one effect.

    With history stopped, two events are accepted. A raw consumer of history's queue takes both
    deliveries without acking: the first it simply drops, the second it stores as history would
    (the effect happened, the ack was lost). Closing its channel puts both back in the queue.
    History, started again, gets both redelivered: exactly one row each.
    """
    settings = fault_stack.settings
    queue_name = f"{settings.broker_prefix}.scores.history"
    fault_stack.make("stop", "SERVICE=history")
    events = [f"unacked-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    async with httpx.AsyncClient(base_url=fault_stack.api, headers=SERVER, timeout=10) as api:
        for i, event_id in enumerate(events):
            body = {"event_id": event_id, "user_id": f"u{i}", "region": "eu", "value": 5 + i}
            answer = await api.post("/v1/boards/main/scores", json=body)
            assert answer.status_code == 200, answer.text

    connection = await connect_broker(settings.amqp_urls)
    async with connection, open_engine(settings.mysql_url, changed_rows=True) as engine:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue(queue_name, passive=True)
        taken: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            taken.append(message)  # and no ack

        tag = await queue.consume(take)  # no_ack=False: each delivery awaits its ack

        async def both_taken() -> bool:
            return {e for m in taken for e in _event_ids(m)} >= set(events)

        await wait_for("both events delivered to the raw consumer", both_taken, 20)
        first_delivery = [(m.delivery_tag, m.redelivered) for m in taken]
        # The second event's effect, as history would make it, and then no ack. (The relay may
        # have put both events in one message: only the second is stored.)
        store = HistoryHandler(engine)
        for message in taken:
            decoded = ScoreMessage.model_validate_json(message.body).events
            await store([e for e in decoded if e.event_id == events[1]])
        assert await count_events(engine, BOARD, events[1]) == 1
        assert await count_events(engine, BOARD, events[0]) == 0
        await queue.cancel(tag)
        await channel.close()  # the unacked deliveries go back to the queue

        fault_stack.make("start", "SERVICE=history")
        fault_stack.wait_ready("history")

        async def both_stored() -> bool:
            return all([await count_events(engine, BOARD, e) == 1 for e in events])

        await wait_for("history stored both events", both_stored, 30)

        async def redelivered_duplicate() -> int:
            name = 'ladder_history_events_total{outcome="duplicate"}'
            return int(await metric(fault_stack.ops("history"), name))

        duplicates = await wait_for("history saw the redelivery", redelivered_duplicate, 10)
        rows = {e: await count_events(engine, BOARD, e) for e in events}
        total = await count_events(engine, BOARD)

    print(
        f"FIGURES channel_closed_before_ack: sent=2 accepted(2xx)=2 "
        f"deliveries_taken_unacked={len(taken)} first_delivery(tag, redelivered)={first_delivery} "
        f"rows_per_event={rows} stored_in_mysql={total} "
        f"history_duplicates_seen={duplicates} duplicates_in_mysql={total - len(events)}"
    )
    assert rows == dict.fromkeys(events, 1)
    assert total == 2
    assert duplicates >= 1, "history never saw the redelivered, already stored event"


def _event_ids(message: aio_pika.abc.AbstractIncomingMessage) -> list[str]:
    return [e.event_id for e in ScoreMessage.model_validate_json(message.body).events]


async def test_consumer_restarted_while_broker_is_down(
    servers: PrivateServers, fault_stack: FaultStack
) -> None:
    """History dies while RabbitMQ is away, and the process manager starts it again at once: it
    must wait for the broker rather than exit, and once the broker is back consume again and
    store every accepted event once."""
    await restarted_while_down(
        fault_stack, "rd", servers.rabbitmq.stop, servers.rabbitmq.start, "broker"
    )
