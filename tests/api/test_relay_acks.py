"""When the outbox relay removes what the broker confirmed (services/api/relay/outbox.py): the
entries of a confirmed message are acknowledged and deleted in the round trip of the stream's
next read, which follows at once (a read that found entries is read again), so a message costs
Redis one round trip, not two. The outbox ends empty, nothing left pending, every event
published once.

Against real Redis and RabbitMQ; what the relay sends Redis is recorded at the connection."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aio_pika.abc import AbstractChannel
from redis.asyncio import Redis

from services.api.relay.outbox import Relay
from shared.keys import OUTBOX_GROUP, Keys
from shared.redis import PackedConnection
from shared.settings import LadderSettings
from tests.helpers import catalog_of, eventually, tap_fanout
from tests.shared.test_relay_groups import taken
from tests.shared.test_relay_outage import relaying


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every round trip's bytes that a Redis client of this process sends."""
    trips: list[bytes] = []
    send = PackedConnection.send_packed_command

    async def recorded(self: PackedConnection, command: Any, check_health: bool = True) -> None:
        parts = [command] if isinstance(command, bytes | str) else list(command)
        trips.append(b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts))
        await send(self, command, check_health)

    monkeypatch.setattr(PackedConnection, "send_packed_command", recorded)
    return trips


async def test_a_confirmed_message_is_removed_in_the_round_trip_of_the_next_read(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    channel: AbstractChannel,
    sent: list[bytes],
) -> None:
    _, tap = await tap_fanout(channel, settings.broker_prefix)
    relay = Relay(redis, keys, await catalog_of(redis, keys, ["main"]), settings)
    stream = keys.outbox("main")
    async with relaying(relay):
        for burst in range(3):
            ids = [
                await redis.xadd(stream, {"e": orjson.dumps({"n": burst * 10 + n}).decode()})
                for n in range(5)
            ]
            relay.wake("main")
            bodies = await taken(tap, 1)
            assert [e["outbox_id"] for b in bodies for e in orjson.loads(b)["events"]] == ids

            async def removed() -> bool:
                return await redis.xlen(stream) == 0

            await eventually(removed)
            pending = await redis.xpending(stream, OUTBOX_GROUP)
            assert pending["pending"] == 0

    acks = [trip for trip in sent if b"XACK" in trip]
    assert len(acks) >= 3, "each message's entries acknowledged"
    # Each acknowledgement, with the deletion, rode on a read of the stream.
    assert all(b"XDEL" in trip and b"XREADGROUP" in trip for trip in acks), acks
