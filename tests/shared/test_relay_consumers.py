"""The consumers of the relays' groups, against real Redis and RabbitMQ (docs/reliability.md, "A
crashed relay"): every relay process is a consumer of each group it reads, named after its host
and process id, so every start of a process adds one. A relay stopped gracefully deletes its own
consumer from each group it read, unless entries are still pending for it; a claim, and a relay's
first read of a stream, delete the consumers that have nothing pending and have been idle
``FORGET_IDLE_CLAIMS`` times ``LADDER_RELAY_CLAIM_IDLE_MS``; a consumer holding entries is never
deleted, however idle. Before, nothing deleted a consumer: each group kept one a process start
for good."""

from __future__ import annotations

import orjson
from aio_pika.abc import AbstractChannel
from redis.asyncio import Redis
from structlog.testing import capture_logs

from services.aggregator.period_relay import PeriodRelay
from services.api.relay.outbox import Relay
from shared.boards import BoardCatalog
from shared.keys import OUTBOX_GROUP, Keys
from shared.redis import forget_consumers
from shared.relaying import FORGET_IDLE_CLAIMS
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import catalog_of, eventually, tap_fanout
from tests.shared.test_relay_outage import relaying


async def consumers(redis: Redis, stream: str) -> dict[str, int]:
    """Each consumer of ``stream``'s group ``relay``, with its pending entries."""
    found = await redis.xinfo_consumers(stream, OUTBOX_GROUP)
    return {str(c["name"]): int(c["pending"]) for c in found}


async def test_a_relay_stopped_leaves_every_group_it_read_and_no_other_consumer(
    settings: LadderSettings, redis: Redis, keys: Keys, channel: AbstractChannel
) -> None:
    await tap_fanout(channel, settings.broker_prefix)
    catalog = await catalog_of(redis, keys, ["main", "cup"])
    streams = [keys.outbox("main"), keys.outbox("cup")]
    for stream in streams:
        await redis.xadd(stream, {"e": orjson.dumps({"n": 1}).decode()})
    # Another process's consumer, nothing pending, idle a moment: not this relay's to delete.
    await redis.xgroup_create(streams[0], OUTBOX_GROUP, id="0")
    await redis.xgroup_createconsumer(streams[0], OUTBOX_GROUP, "other")
    relay = Relay(redis, keys, catalog, settings)

    async def relayed() -> bool:
        return not any([await redis.xlen(stream) for stream in streams])

    with capture_logs() as logs:
        async with relaying(relay):
            await eventually(relayed)
            assert relay._consumer in await consumers(redis, streams[1])

    assert await consumers(redis, streams[0]) == {"other": 0}
    assert await consumers(redis, streams[1]) == {}
    [said] = [e for e in logs if e["event"] == "relay left its consumer groups"]
    assert (said["left"], said["groups"]) == (2, 2)


async def test_a_period_relay_stopped_keeps_its_consumer_while_entries_are_pending_for_it(
    settings: LadderSettings, redis: Redis, keys: Keys, broker: Topology, channel: AbstractChannel
) -> None:
    """Its message routed to no queue, the entry stays pending for the relay: stopped, its
    consumer stays with it (deleted, the entry would be read by nobody again). Once a queue is
    bound, the relay started again publishes it, and stopped leaves the group."""
    catalog = await catalog_of(redis, keys, ["cup"])
    stream = keys.periods_outbox("cup")
    body = {"board_id": "cup", "period": "daily", "period_id": "2026-12-01", "scopes": {}}
    await redis.xadd(stream, {"m": orjson.dumps(body).decode(), "i": "cup:daily:2026-12-01"})
    await redis.xgroup_create(stream, OUTBOX_GROUP, id="0")
    relay = PeriodRelay(redis, keys, catalog, settings)

    async def pending() -> bool:
        return (await redis.xpending(stream, OUTBOX_GROUP))["pending"] == 1

    async with relaying(relay):
        await eventually(pending)
    assert await consumers(redis, stream) == {relay._consumer: 1}

    tap = await channel.declare_queue(exclusive=True)
    await tap.bind(await broker.declare_periods_exchange(channel))

    async def relayed() -> bool:
        return not await redis.xlen(stream)

    async with relaying(relay):
        await eventually(relayed)
    assert await consumers(redis, stream) == {}
    assert await tap.get(no_ack=True, fail=False) is not None


async def test_a_claim_forgets_the_consumers_idle_long_with_nothing_pending(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Of a stopped process that acknowledged its read, and of one that died holding an entry
    (claimed first, then forgotten): both go once idle ``FORGET_IDLE_CLAIMS`` claim thresholds
    (2 s here); a live one that keeps reading entries stays at every claim."""
    fast = settings.model_copy(update={"relay_claim_idle_ms": 100})
    stream = keys.outbox("main")
    for n in range(2):
        await redis.xadd(stream, {"e": str(n)})
    await redis.xgroup_create(stream, OUTBOX_GROUP, id="0")
    read = await redis.xreadgroup(OUTBOX_GROUP, "acknowledged", {stream: ">"}, count=1)
    await redis.xack(stream, OUTBOX_GROUP, read[0][1][0][0])
    await redis.xreadgroup(OUTBOX_GROUP, "died", {stream: ">"}, count=1)
    live = Relay(redis, keys, BoardCatalog(redis, keys), fast)

    async def forgotten() -> bool:
        # The live one reads an entry (and confirms it) every pass: its idle time stays small.
        await redis.xadd(stream, {"e": "more"})
        read = await redis.xreadgroup(OUTBOX_GROUP, "alive", {stream: ">"}, count=1)
        await redis.xack(stream, OUTBOX_GROUP, read[0][1][0][0])
        await live._claim(stream, 10)
        found = await consumers(redis, stream)
        assert found["alive"] == 0, found
        return found == {"alive": 0, live._consumer: 1}

    assert FORGET_IDLE_CLAIMS * fast.relay_claim_idle_ms == 2000
    await eventually(forgotten)


async def test_a_relays_first_read_of_a_stream_forgets_the_consumers_idle_long(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """A board read only now and then: the process reading it after a restart forgets what the
    processes before it left (a claim sees the board only while it holds entries)."""
    fast = settings.model_copy(update={"relay_claim_idle_ms": 100})
    stream = keys.outbox("main")
    await redis.xadd(stream, {"e": "1"})
    await redis.xgroup_create(stream, OUTBOX_GROUP, id="0")
    await redis.xgroup_createconsumer(stream, OUTBOX_GROUP, "before")

    async def idle_long() -> bool:
        [found] = await redis.xinfo_consumers(stream, OUTBOX_GROUP)
        return int(found["idle"]) > FORGET_IDLE_CLAIMS * fast.relay_claim_idle_ms

    await eventually(idle_long)
    relay = Relay(redis, keys, BoardCatalog(redis, keys), fast)
    assert [fields for _, fields in await relay._read(stream, ">", 10) or []] == [{"e": "1"}]
    assert await consumers(redis, stream) == {relay._consumer: 1}


async def test_a_consumer_holding_entries_is_never_forgotten(redis: Redis, keys: Keys) -> None:
    stream = keys.outbox("main")
    await redis.xadd(stream, {"e": "1"})
    await redis.xgroup_create(stream, OUTBOX_GROUP, id="0")
    await redis.xreadgroup(OUTBOX_GROUP, "holding", {stream: ">"}, count=1)
    await redis.xgroup_createconsumer(stream, OUTBOX_GROUP, "empty")

    assert await forget_consumers(redis, [stream], OUTBOX_GROUP, 0, "holding") == 0
    assert await forget_consumers(redis, [stream], OUTBOX_GROUP, 0) == 1
    assert await consumers(redis, stream) == {"holding": 1}
    # A stream gone, or one without the group: nothing to forget, and no error.
    await redis.xadd(keys.outbox("bare"), {"e": "1"})
    others = [keys.outbox("gone"), keys.outbox("bare")]
    assert await forget_consumers(redis, others, OUTBOX_GROUP, 0) == 0
