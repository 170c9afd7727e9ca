"""Which period outboxes the aggregator's period relay looks at (services/aggregator/
period_relay.py): a poll asks about ``SWEEP_MOST`` boards at most, the next ones in turn at the
next poll; a poll that claims asks about every board. Whatever the turn, an outbox that holds
messages is read.

The outboxes are real streams; the broker is not needed to tell which is looked at and read:
each look (``_lengths``) and each read (``relay_board``, which takes its outbox's entries) is
recorded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from services.aggregator import period_relay
from services.aggregator.period_relay import PeriodRelay
from shared import relaying
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import catalog_of, eventually

BOARDS = [f"b{i:02}" for i in range(20)]


class Recording(PeriodRelay):
    """A period relay whose looks and reads are recorded; a read takes its outbox's entries."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.looked: list[list[str]] = []
        self.reads: list[str] = []

    async def _lengths(self, boards: list[str]) -> dict[str, int]:
        self.looked.append(list(boards))
        return await super()._lengths(boards)

    async def relay_board(self, board_id: str, claim: bool) -> int:
        self.reads.append(board_id)
        stream = self._keys.periods_outbox(board_id)
        entries = int(await self._redis.xlen(stream))
        await self._redis.delete(stream)
        return entries


@contextlib.asynccontextmanager
async def polling(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    monkeypatch: pytest.MonkeyPatch,
    claim: float,
) -> AsyncIterator[Recording]:
    monkeypatch.setattr(relaying, "SWEEP_MOST", 6)
    monkeypatch.setattr(period_relay, "POLL_SECONDS", 0.02)
    monkeypatch.setattr(period_relay, "CLAIM_EVERY_SECONDS", claim)
    relay = Recording(redis, keys, await catalog_of(redis, keys, BOARDS), settings)
    stop = asyncio.Event()
    task = asyncio.create_task(relay._pump(stop))
    try:
        yield relay
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def polled(relay: Recording, times: int) -> None:
    async def enough() -> bool:
        return len(relay.looked) >= times

    await eventually(enough)


async def drained(redis: Redis, keys: Keys, *board_ids: str) -> None:
    async def empty() -> bool:
        return not any([await redis.xlen(keys.periods_outbox(b)) for b in board_ids])

    await eventually(empty)


async def test_a_poll_asks_about_a_bounded_turn_of_the_boards_and_reads_any_that_hold(
    redis: Redis, keys: Keys, settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with polling(redis, keys, settings, monkeypatch, claim=60.0) as relay:
        await polled(relay, 5)
        # The first poll claims, and a claim asks about every board; then 6 a poll, in turn.
        assert relay.looked[0] == BOARDS
        turns = relay.looked[1:5]
        assert all(len(turn) == 6 for turn in turns)
        assert turns[0] + turns[1] + turns[2] + turns[3][:2] == BOARDS

        await redis.xadd(keys.periods_outbox("b02"), {"m": "{}"})
        await redis.xadd(keys.periods_outbox("b16"), {"m": "{}"})
        await drained(redis, keys, "b02", "b16")
        assert set(relay.reads) == {"b02", "b16"}


async def test_a_poll_that_claims_asks_about_every_board(
    redis: Redis, keys: Keys, settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with polling(redis, keys, settings, monkeypatch, claim=0.0) as relay:
        await polled(relay, 3)
        assert all(turn == BOARDS for turn in relay.looked)

        await redis.xadd(keys.periods_outbox("b00"), {"m": "{}"})
        await redis.xadd(keys.periods_outbox("b19"), {"m": "{}"})
        await drained(redis, keys, "b00", "b19")
        assert set(relay.reads) == {"b00", "b19"}


class Keeping(PeriodRelay):
    """A period relay whose reads publish nothing and leave the outboxes as they are."""

    async def relay_board(self, board_id: str, claim: bool) -> int:
        return 0


async def test_a_board_deleted_leaves_no_backlog_gauge_behind(
    redis: Redis, keys: Keys, settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A board's period outbox holds messages, and the backlog gauge says how many; the board
    deleted (its outbox with it), the gauge goes to 0 rather than keep its last value."""
    monkeypatch.setattr(period_relay, "POLL_SECONDS", 0.02)
    catalog = await catalog_of(redis, keys, ["kept", "gone"])
    relay = Keeping(redis, keys, catalog, settings)
    await redis.xadd(keys.periods_outbox("gone"), {"m": "{}"})
    await redis.xadd(keys.periods_outbox("gone"), {"m": "{}"})

    def backlog(board_id: str) -> float | None:
        return REGISTRY.get_sample_value("ladder_periods_backlog", {"board_id": board_id})

    stop = asyncio.Event()
    task = asyncio.create_task(relay._pump(stop))
    try:
        await until_true(lambda: backlog("gone") == 2)
        await catalog.remove("gone")
        await redis.delete(keys.periods_outbox("gone"))
        await until_true(lambda: backlog("gone") == 0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def until_true(condition: Callable[[], bool]) -> None:
    async def holds() -> bool:
        return condition()

    await eventually(holds)
