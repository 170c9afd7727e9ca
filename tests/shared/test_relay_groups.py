"""The relays' consumer groups once a board's keys went (shared/relaying.py): a board deleted (its
outbox, and the group on it, unlinked with its keys) and made again, its outbox written anew by
the fresh board, is relayed as any other. Whatever meets the missing group (``NOGROUP``) first,
a read, a claim, the first pass of a pump started again, makes it again from the stream's first
entry and goes on, and the other boards' outboxes go out meanwhile; a relay that connects again
takes no group on trust. The relay makes no outbox of a deleted board again.

Against real Redis, and for the pumps real RabbitMQ: each relay's messages are taken from a
queue of the test's own bound to its exchange."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractQueue
from redis.asyncio import Redis
from structlog.testing import capture_logs

from services.aggregator import period_relay
from services.aggregator.period_relay import PeriodRelay
from services.api.relay import outbox
from services.api.relay.outbox import Relay
from shared.boards import BoardCatalog
from shared.keys import OUTBOX_GROUP, Keys
from shared.relaying import StreamRelay
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import catalog_of, eventually, tap_fanout
from tests.shared.test_relay_outage import relaying

# "cup" sorts before "main": a pass that stopped at the board made again would never reach it.
BOARDS = ["cup", "main"]
RELAYS = [Relay, PeriodRelay]


async def cached(relay: StreamRelay, board_id: str) -> str:
    """The board's stream, one entry of it read and confirmed: its group made, and known to the
    relay."""
    stream = relay._stream_of(board_id)
    entry = await relay._redis.xadd(stream, {"e": "before"})
    assert [entry_id for entry_id, _ in await relay._read(stream, ">", 10) or []] == [entry]
    await relay._redis.xack(stream, OUTBOX_GROUP, entry)
    await relay._redis.xdel(stream, entry)
    return stream


@pytest.mark.parametrize("relay_class", RELAYS)
async def test_a_read_of_a_board_made_again_makes_its_group_again_and_reads_it(
    redis: Redis, keys: Keys, settings: LadderSettings, relay_class: type[Relay | PeriodRelay]
) -> None:
    relay = relay_class(redis, keys, BoardCatalog(redis, keys), settings)
    stream = await cached(relay, "cup")
    await redis.unlink(stream)  # the board deleted
    fresh = await redis.xadd(stream, {"e": "fresh"})  # the fresh board's first write

    # Read at once, from the new stream's first entry: none of it is skipped.
    assert await relay._read(stream, ">", 10) == [(fresh, {"e": "fresh"})]
    assert await relay._read(stream, "0", 10) == [(fresh, {"e": "fresh"})]


@pytest.mark.parametrize("relay_class", RELAYS)
async def test_a_claim_on_a_board_made_again_makes_its_group_again(
    redis: Redis, keys: Keys, settings: LadderSettings, relay_class: type[Relay | PeriodRelay]
) -> None:
    relay = relay_class(redis, keys, BoardCatalog(redis, keys), settings)
    stream = await cached(relay, "cup")
    await redis.unlink(stream)
    fresh = await redis.xadd(stream, {"e": "fresh"})

    assert not await relay._claim(stream, 10)  # nothing was pending in the new group
    assert await relay._read(stream, ">", 10) == [(fresh, {"e": "fresh"})]


async def test_the_relay_makes_no_outbox_of_a_deleted_board_again(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    relay = Relay(redis, keys, BoardCatalog(redis, keys), settings)
    stream = await cached(relay, "cup")
    await redis.unlink(stream)

    assert not await relay._claim(stream, 10)
    for start in ("0", ">", ">"):
        assert not await relay._read(stream, start, 10)
    never = keys.outbox("never")
    assert not await relay._read(never, ">", 10)
    assert await redis.exists(stream, never) == 0


async def taken(tap: AbstractQueue, count: int) -> list[bytes]:
    """The bodies of ``count`` messages from ``tap``, as they come."""
    bodies: list[bytes] = []

    async def enough() -> bool:
        message = await tap.get(no_ack=True, fail=False)
        if message is not None:
            bodies.append(message.body)
        return len(bodies) >= count

    await eventually(enough)
    return bodies


async def emptied(redis: Redis, streams: list[str]) -> bool:
    """Whether every one of ``streams`` holds no entry."""
    return all([await redis.xlen(stream) == 0 for stream in streams])


@contextlib.asynccontextmanager
async def running(relay: StreamRelay) -> AsyncIterator[None]:
    """The relay relaying, the redis-unavailable warnings it logs meanwhile none."""
    with capture_logs() as logs:
        async with relaying(relay):
            yield
    assert not [line for line in logs if line["event"] == "redis unavailable to the relay"]


async def test_the_score_relay_goes_on_relaying_a_board_made_again_and_the_others(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    channel: AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every pass claims: the pass that meets the missing group first is a claim.
    monkeypatch.setattr(outbox, "_CLAIM_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(outbox, "_SWEEP_SECONDS", 0.05)
    _, tap = await tap_fanout(channel, settings.broker_prefix)
    relay = Relay(redis, keys, await catalog_of(redis, keys, BOARDS), settings)

    def event(board_id: str, n: int) -> str:
        return orjson.dumps({"board_id": board_id, "n": n}).decode()

    async with running(relay):
        for board_id in BOARDS:
            await redis.xadd(keys.outbox(board_id), {"e": event(board_id, 1)})
        await taken(tap, 2)
        await redis.unlink(keys.outbox("cup"))
        ids = [await redis.xadd(keys.outbox(b), {"e": event(b, 2)}) for b in BOARDS]

        bodies = await taken(tap, 2)
        events = [e for body in bodies for e in orjson.loads(body)["events"]]
        # Each event with its entry's id, which the event log orders the board's events by.
        assert sorted(events, key=lambda e: e["board_id"]) == [
            {"outbox_id": ids[0], "board_id": "cup", "n": 2},
            {"outbox_id": ids[1], "board_id": "main", "n": 2},
        ]
        # Each entry goes once its message is confirmed, which may be after the tap has it.
        await eventually(lambda: emptied(redis, [keys.outbox(b) for b in BOARDS]))


async def test_the_period_relay_goes_on_relaying_a_board_made_again_and_the_others(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    broker: Topology,
    channel: AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(period_relay, "CLAIM_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(period_relay, "POLL_SECONDS", 0.05)
    tap = await channel.declare_queue(exclusive=True)
    await tap.bind(await broker.declare_periods_exchange(channel))
    relay = PeriodRelay(redis, keys, await catalog_of(redis, keys, BOARDS), settings)

    def closed(board_id: str, period_id: str) -> str:
        message = {"board_id": board_id, "period": "daily", "period_id": period_id}
        return orjson.dumps(message).decode()

    async with running(relay):
        for board_id in BOARDS:
            await redis.xadd(keys.periods_outbox(board_id), {"m": closed(board_id, "2026-12-01")})
        await taken(tap, 2)
        await redis.unlink(keys.periods_outbox("cup"))
        for board_id in BOARDS:
            await redis.xadd(keys.periods_outbox(board_id), {"m": closed(board_id, "2026-12-02")})

        bodies = sorted(await taken(tap, 2))
        assert bodies == [closed(b, "2026-12-02").encode() for b in BOARDS]
        await eventually(lambda: emptied(redis, [keys.periods_outbox(b) for b in BOARDS]))


class Restarting(PeriodRelay):
    """A period relay whose pump reads one board and returns, as a pump the broker failed
    under does: the groups it knows of as each pump starts are recorded."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.known: list[set[str]] = []
        self.stop = asyncio.Event()

    async def _pump(self, stop: asyncio.Event) -> None:
        self.known.append(set(self._groups))
        await self._read(self._stream_of("cup"), ">", 10)
        if len(self.known) == 2:
            self.stop.set()


async def test_a_relay_that_connects_again_takes_no_group_on_trust(
    redis: Redis, keys: Keys, settings: LadderSettings, broker: Topology
) -> None:
    relay = Restarting(redis, keys, await catalog_of(redis, keys, BOARDS), settings)
    await redis.xadd(keys.periods_outbox("cup"), {"m": "{}"})
    await asyncio.wait_for(relay.relay_until(relay.stop), 10)

    # The first pump made the group; the second, after connecting again, knew of none.
    assert relay.known == [set(), set()]
