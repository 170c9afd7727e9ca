"""An event MySQL refuses, through the whole of Ladder: the API accepts it, the aggregator and
the notifier handle it like any other, history dead-letters it after the documented deliveries
and stores every other event, before and after it."""

from __future__ import annotations

import re
import uuid

import aio_pika
import httpx
import orjson
import pytest
from sqlalchemy import text

from shared.amqp import connect as connect_broker
from shared.db import count_events, open_engine
from shared.topology import CONSUMERS, Topology
from tests.helpers import SERVER, eventually
from tests.stack import Stack

pytestmark = pytest.mark.stack


async def test_a_refused_event_is_dead_lettered_by_history_alone(stack: Stack) -> None:
    settings = stack.settings
    topology = Topology(settings.broker_prefix, settings.delivery_limit)
    tag = uuid.uuid4().hex[:6]
    refused, before, after = f"refused-{tag}", f"before-{tag}", f"after-{tag}"
    connection = await connect_broker(settings.amqp_urls)
    async with (
        open_engine(settings.mysql_url) as engine,
        connection,
        httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api,
    ):
        async with engine.begin() as conn:
            await conn.execute(
                text("ALTER TABLE score_events ADD CONSTRAINT refuse_666 CHECK (value <> 666)")
            )
        for event_id, user, value in ((before, "u-a", 5), (refused, "u-b", 666), (after, "u-c", 7)):
            answer = await api.post(
                "/v1/boards/main/scores",
                json={"event_id": event_id, "user_id": user, "region": "eu", "value": value},
            )
            assert answer.status_code == 200, answer.text

        async def both_stored() -> bool:
            counts = [await count_events(engine, "main", e) for e in (before, after)]
            return counts == [1, 1]

        await eventually(both_stored, within=20)
        channel = await connection.channel()

        async def dead_lettered() -> list[aio_pika.abc.AbstractIncomingMessage] | None:
            dead = await channel.get_queue(topology.dead_queue("history"))
            message = await dead.get(fail=False, no_ack=True)
            return [message] if message is not None else None

        dead = (await eventually(dead_lettered, within=30))[0]

        # The aggregator took the event like any other: u-b leads the global board.
        async def leader() -> dict[str, object] | None:
            board = (await api.get("/v1/boards/main/leaderboard", params={"limit": 3})).json()
            entries = board["entries"]
            return entries[0] if entries and entries[0]["user_id"] == "u-b" else None

        top = await eventually(leader, within=20)
        others_dead = [
            (
                await channel.declare_queue(topology.dead_queue(c), passive=True)
            ).declaration_result.message_count
            for c in CONSUMERS
            if c != "history"
        ]
        history_metrics = (await api.get(f"{stack.ops('history')}/metrics")).text
        assert await count_events(engine, "main", refused) == 0

    assert refused in [e["event_id"] for e in orjson.loads(dead.body)["events"]]
    assert dead.headers["x-first-death-reason"] == "delivery_limit"
    assert top["score"] == 666
    assert others_dead == [0, 0]
    requeued = re.search(
        r'^ladder_consumer_messages_total\{consumer="history",outcome="refused"\} (\S+)$',
        history_metrics,
        re.MULTILINE,
    )
    assert requeued is not None and float(requeued.group(1)) == settings.delivery_limit
