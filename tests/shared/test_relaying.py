"""The stream reads both relays share (shared/relaying.py), against real Redis: pending entries
come back to their consumer, one deleted while pending leaves the group's pending list, and a
stream whose group went away gets it back in the same read (tests/shared/test_relay_groups.py:
a board deleted and made again); a claim takes every entry dead consumers left, and the outbox
relay publishes a dead one's whole read soon after its entries are idle long enough."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import orjson
from aio_pika.abc import AbstractChannel
from redis.asyncio import Redis

from services.api.relay.outbox import IN_FLIGHT, Relay
from shared.boards import BoardCatalog
from shared.keys import OUTBOX_GROUP, Keys
from shared.settings import LadderSettings
from tests.helpers import catalog_of, tap_fanout
from tests.shared.test_relay_outage import relaying


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


async def test_a_claim_takes_every_idle_entry_however_many_calls_it_takes(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    """``count`` bounds one ``XAUTOCLAIM``, not the claim: it goes on through the group's pending
    list to its end, taking what each dead consumer left (a relay leaves up to a read's worth,
    ``IN_FLIGHT`` messages), and leaves alone what a live consumer read just now. Before, a
    claim took ``count`` entries, and the rest waited for the next claims, seconds apart."""
    stream = keys.outbox("main")
    for n in range(60):
        await redis.xadd(stream, {"e": str(n)})
    await redis.xgroup_create(stream, OUTBOX_GROUP, id="0")
    for dead in ("dead-1", "dead-2"):
        await redis.xreadgroup(OUTBOX_GROUP, dead, {stream: ">"}, count=25)
    # The dead ones' entries idle past the threshold; the live one's read well within it, so
    # that a loaded machine's pause before the claim does not make them idle too.
    await asyncio.sleep(1.6)
    await redis.xreadgroup(OUTBOX_GROUP, "alive", {stream: ">"}, count=10)
    live = Relay(
        redis,
        keys,
        BoardCatalog(redis, keys),
        settings.model_copy(update={"relay_claim_idle_ms": 1500}),
    )

    assert await live._claim(stream, 10)
    owners = await redis.xpending(stream, OUTBOX_GROUP)
    assert {c["name"]: c["pending"] for c in owners["consumers"]} == {
        live._consumer: 50,
        "alive": 10,
    }
    assert not await live._claim(stream, 10)  # nothing idle left


async def test_a_dead_relays_whole_read_goes_out_at_the_first_claim_after_it_is_idle(
    redis: Redis, keys: Keys, settings: LadderSettings, channel: AbstractChannel
) -> None:
    """A relay that died holding a full read (``IN_FLIGHT`` batches, unconfirmed) has all of it
    published again by a survivor's first claim once it is idle ``LADDER_RELAY_CLAIM_IDLE_MS``,
    each event once, a batch a message at most, and before the entries written since (docs/
    reliability.md, "A crashed relay"). Before, a claim round took one batch (``relay_batch``) a
    board, every 5 s: the read's last batch went out 35 s after its first (the reviewer's run,
    idle 0.5 s: all out after about 36 s)."""
    fast = settings.model_copy(update={"relay_claim_idle_ms": 100, "relay_batch": 20})
    stream = keys.outbox("main")
    total = fast.relay_batch * IN_FLIGHT
    ids = [await redis.xadd(stream, {"e": orjson.dumps({"n": n}).decode()}) for n in range(total)]
    await redis.xgroup_create(stream, OUTBOX_GROUP, id="0")
    read = await redis.xreadgroup(OUTBOX_GROUP, "dead-1", {stream: ">"}, count=total)
    assert len(read[0][1]) == total
    ids += [
        await redis.xadd(stream, {"e": orjson.dumps({"n": total + n}).decode()}) for n in range(5)
    ]
    await asyncio.sleep(0.15)  # idle past the claim's threshold before the survivor starts
    _, tap = await tap_fanout(channel, fast.broker_prefix)
    relay = Relay(redis, keys, await catalog_of(redis, keys, ["main"]), fast)

    # 4.5 s at most, the relay's start included: within the first claim round and before the
    # next (5 s apart), which the claim of one batch a round needed seven of.
    async with relaying(relay):
        for _ in range(90):
            if not await redis.xlen(stream):
                break
            await asyncio.sleep(0.05)
    left = await redis.xlen(stream)
    assert left == 0, f"{left} of {total + 5} entries still in the outbox after 4.5 s"
    batches = []
    while (message := await tap.get(no_ack=True, fail=False)) is not None:
        batches.append([e["outbox_id"] for e in orjson.loads(message.body)["events"]])
    assert max(len(batch) for batch in batches) <= fast.relay_batch
    published = [entry_id for batch in batches for entry_id in batch]
    assert sorted(published) == sorted(ids) and len(published) == len(ids)
    assert published[-5:] == ids[-5:]  # the entries written since go out after the read


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
