"""The broker delivers at least once: a message delivered again changes nothing anywhere."""

from __future__ import annotations

import uuid

import httpx
import pytest
from redis.asyncio import Redis

from shared.amqp import connect as connect_broker
from shared.db import count_events, open_engine
from shared.keys import Keys
from tests.helpers import (
    SERVER,
    eventually,
    global_entry,
    player_token,
    republish,
    tap_fanout,
)
from tests.stack import Stack, open_socket

pytestmark = pytest.mark.stack


async def test_a_redelivered_message_has_one_effect(stack: Stack, redis: Redis) -> None:
    settings = stack.settings
    keys = Keys(settings.key_prefix)
    connection = await connect_broker(settings.amqp_urls)
    async with connection, httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
        channel = await connection.channel()
        exchange, tap = await tap_fanout(channel, settings.broker_prefix)

        user = f"u-{uuid.uuid4().hex[:6]}"
        socket = await open_socket(stack, player_token(user))
        event_id = f"again-{uuid.uuid4().hex[:8]}"
        answer = await api.post(
            "/v1/boards/main/scores",
            json={"event_id": event_id, "user_id": user, "region": "na", "value": 7},
        )
        assert answer.status_code == 200
        await socket.expect(lambda m: m["type"] == "rank" and m["period"] == "alltime")

        message = await eventually(lambda: tap.get(no_ack=True, fail=False))
        assert event_id in message.body.decode()

        async with open_engine(settings.mysql_url) as engine:
            assert await eventually(lambda: count_events(engine, "main", event_id)) == 1

            async def merged() -> tuple[str, float] | None:
                return await global_entry(redis, keys, user)

            before = await eventually(merged)

            # Deliver the very same message to all three consumers again.
            await republish(exchange, message)
            # Then a fresh event behind it: once it is everywhere, the duplicate was handled.
            marker = f"marker-{uuid.uuid4().hex[:8]}"
            assert (
                await api.post(
                    "/v1/boards/main/scores",
                    json={"event_id": marker, "user_id": user, "region": "na", "value": 1},
                )
            ).status_code == 200
            assert await eventually(lambda: count_events(engine, "main", marker)) == 1
            await socket.sync()

            assert await count_events(engine, "main", event_id) == 1
            assert await count_events(engine, "main") == 2

        async def remerged() -> tuple[str, float] | None:
            now = await global_entry(redis, keys, user)
            return now if now != before else None

        await eventually(remerged)
        standing = (
            await api.get(f"/v1/boards/main/users/{user}", params={"scope": "global"})
        ).json()
        assert standing["score"] == 8, "7 once, plus the marker's 1"

        # The notifier pushed the first event's messages once, not again for the duplicate.
        entered = [
            m
            for m in socket.received
            if m["type"] == "rank" and m["reason"] == "entered_top" and m["period"] == "alltime"
        ]
        assert len(entered) == 1
        await socket.connection.close()
