"""A user's erasure racing the period relay (docs/api.md section 8b, "Erasing a user";
docs/reliability.md, "Erasure and the period outbox"): the rewriting of a ``period.closed``
message never follows its original under the same ``message_id``, which a consumer that
deduplicates on it (as it should) would drop, keeping the copy that names the erased user.

Each race is made deterministic by a relay that runs the erasure's outbox step at the point of
the race: between its read of the entry and its publish (the rewriting wins: only it goes out),
and while the broker is taking the message (the original wins: it goes out as it was, and
nothing after it)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aio_pika.abc import AbstractQueue
from redis.asyncio import Redis

from services.aggregator.period_relay import PeriodRelay
from services.api.erased_periods import erase_from_period_outboxes
from shared.amqp import connect as connect_broker
from shared.boards import Board, BoardCatalog
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.aggregator.test_period_outbox_erasure import message

CUP = Board(board_id="cup", periods=("daily",), regions=("eu",))
ID = "cup:daily:2026-12-01"


class ErasedAfterTheRead(PeriodRelay):
    """The erasure's rewriting lands after the relay read the entry, before it publishes it."""

    erased = False

    async def _read(self, stream: str, start: str, count: int) -> Any:
        entries = await super()._read(stream, start, count)
        if entries and not self.erased:
            self.erased = True
            await erase_from_period_outboxes(self._redis, self._keys, ["cup"], "x")
        return entries


class ErasedWhilePublishing(PeriodRelay):
    """The erasure's pass runs while the broker is taking the message."""

    erasing: asyncio.Task[int] | None = None

    async def _publish(self, entry: dict[str, str]) -> None:
        if self.erasing is None:
            self.erasing = asyncio.create_task(
                erase_from_period_outboxes(self._redis, self._keys, ["cup"], "x")
            )
            await asyncio.sleep(0.3)  # the pass runs its step meanwhile
        await super()._publish(entry)


async def received(tap: AbstractQueue) -> list[tuple[str, dict[str, Any]]]:
    """What the tap gets, in order, until nothing more comes for 1.5 s (the relay polls every
    0.5 s: a second copy would come within that)."""
    got: list[tuple[str, dict[str, Any]]] = []
    quiet = 0
    while quiet < 15:
        await asyncio.sleep(0.1)
        quiet += 1
        while (one := await tap.get(no_ack=True, fail=False)) is not None:
            got.append((str(one.message_id), orjson.loads(one.body)))
            quiet = 0
    return got


def named(body: dict[str, Any]) -> list[str]:
    return [e["user_id"] for e in body["scopes"]["global"]]


@pytest.mark.parametrize("relay_class", [ErasedAfterTheRead, ErasedWhilePublishing])
async def test_one_copy_of_a_message_goes_out_whoever_wins_the_race(
    settings: LadderSettings,
    redis: Redis,
    keys: Keys,
    broker: Topology,
    relay_class: type[ErasedAfterTheRead | ErasedWhilePublishing],
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(CUP)
    outbox = keys.periods_outbox("cup")
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        exchange = await broker.declare_periods_exchange(channel)
        tap = await channel.declare_queue(exclusive=True)
        await tap.bind(exchange)
        await redis.xadd(outbox, message("cup", "2026-12-01", ["a", "x", "b"]))
        relay = relay_class(redis, keys, catalog, settings)
        stop = asyncio.Event()
        running = asyncio.create_task(relay.relay_until(stop))
        try:
            got = await received(tap)
        finally:
            stop.set()
            await running
        if isinstance(relay, ErasedWhilePublishing):
            assert relay.erasing is not None
            await relay.erasing  # the pass finished, without an error
    # A consumer deduplicating on message_id keeps the first copy: it is the only one.
    assert [mid for mid, _ in got] == [ID]
    expected = ["a", "b"] if relay_class is ErasedAfterTheRead else ["a", "x", "b"]
    assert named(got[0][1]) == expected
    assert await redis.xlen(outbox) == 0
