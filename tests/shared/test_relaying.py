"""The stream reads both relays share (shared/relaying.py), against real Redis: pending entries
come back to their consumer, one deleted while pending leaves the group's pending list, and a
stream whose group went away gets it back in the same read (tests/shared/test_relay_groups.py:
a board deleted and made again)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from redis.asyncio import Redis

from services.api.relay.outbox import Relay
from shared.boards import BoardCatalog
from shared.keys import OUTBOX_GROUP, Keys
from shared.settings import LadderSettings


async def test_reads_pending_entries_and_lets_deleted_ones_go(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    relay = Relay(redis, keys, BoardCatalog(redis, keys), settings)
    stream = keys.outbox("main")
    first = await redis.xadd(stream, {"e": "1"})
    second = await redis.xadd(stream, {"e": "2"})

    assert await relay._read(stream, ">", 10) == [(first, {"e": "1"}), (second, {"e": "2"})]
    assert await relay._read(stream, ">", 10) == []
    await redis.xdel(stream, first)

    assert await relay._read(stream, "0", 10) == [(second, {"e": "2"})]
    pending = await redis.xpending_range(stream, OUTBOX_GROUP, "-", "+", 10)
    assert [entry["message_id"] for entry in pending] == [second]


async def test_a_lost_group_is_made_again(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    relay = Relay(redis, keys, BoardCatalog(redis, keys), settings)
    stream = keys.outbox("main")
    await redis.xadd(stream, {"e": "1"})
    assert len(await relay._read(stream, ">", 10) or []) == 1
    await redis.xgroup_destroy(stream, OUTBOX_GROUP)

    # Made again from the stream's first entry: what was read and never confirmed goes out.
    assert [fields for _, fields in await relay._read(stream, ">", 10) or []] == [{"e": "1"}]


async def test_claims_what_another_consumer_left_pending(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    stream = keys.outbox("main")
    await redis.xadd(stream, {"e": "1"})
    gone, live = (
        Relay(redis, keys, BoardCatalog(redis, keys), settings.model_copy(update=update))
        for update in ({}, {"relay_claim_idle_ms": 0})
    )
    gone._consumer, live._consumer = "gone", "live"
    assert len(await gone._read(stream, ">", 10) or []) == 1
    assert await live._read(stream, "0", 10) == []

    assert await live._claim(stream, 10)
    assert [fields for _, fields in await live._read(stream, "0", 10) or []] == [{"e": "1"}]


async def test_a_relay_whose_connection_is_reconnecting_is_not_ready(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    # The API's /readyz names the broker down while its robust connection reconnects (open,
    # not connected), as the consumers' do, not only once it is closed.
    relay = Relay(redis, keys, BoardCatalog(redis, keys), settings)
    connected = asyncio.Event()
    relay._connection = cast(Any, SimpleNamespace(is_closed=False, connected=connected))
    relay._exchange = cast(Any, object())
    assert not relay.ready
    connected.set()
    assert relay.ready
