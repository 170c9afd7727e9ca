"""Which outboxes the relay reads, and when (services/api/relay/outbox.py): a write wakes a read
of its own board's outbox, not of every board's, read again while it finds entries; a sweep
reads every outbox that holds entries, so that entries another process wrote and left are
relayed, and no outbox that holds none (a sweep asks about ``SWEEP_MOST`` boards at most, in
turn; a claim about every board); after a read of less than a message's worth the next
waits as long as eight reads take; every outbox that holds entries is drained on the way out.

The outboxes are real streams; the broker is not needed to tell which is read when: each read
(``Relay._relay_board``, the one step that reads an outbox) is recorded and takes every entry of
its board's outbox."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis

from services.api.relay import outbox
from services.api.relay.outbox import Relay
from shared import relaying
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import catalog_of, eventually

BOARDS = [f"b{i:02}" for i in range(20)]


async def until(condition: Callable[[], bool]) -> None:
    async def holds() -> bool:
        return condition()

    await eventually(holds)


class Recording(Relay):
    """A relay whose reads are recorded; a read of a board takes its outbox's entries."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.reads: list[str] = []
        self.read_at: list[float] = []
        self.sweeps = 0
        # The boards each sweep asked about.
        self.swept: list[list[str]] = []
        # Seconds each read is taken to last (the relay paces its reads by it).
        self.took = 0.0

    async def _holding_entries(self, boards: list[str]) -> set[str]:
        self.sweeps += 1
        self.swept.append(list(boards))
        return await super()._holding_entries(boards)

    async def _relay_board(self, board_id: str, claim: bool) -> int:
        self.reads.append(board_id)
        self.read_at.append(time.monotonic())
        self._read_took = self.took
        stream = self._keys.outbox(board_id)
        entries = int(await self._redis.xlen(stream))
        await self._redis.delete(stream)
        return entries


async def drained(redis: Redis, keys: Keys, *board_ids: str) -> None:
    """Until the boards' outboxes are empty: a read (``Recording._relay_board``) is recorded
    before it takes the entries, so its record alone does not say they are gone."""

    async def empty() -> bool:
        return not any([await redis.xlen(keys.outbox(board_id)) for board_id in board_ids])

    await eventually(empty)


async def write(redis: Redis, keys: Keys, board_id: str, entries: int) -> None:
    for i in range(entries):
        await redis.xadd(keys.outbox(board_id), {"e": str(i)})


@contextlib.asynccontextmanager
async def pumping(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> AsyncIterator[tuple[Recording, asyncio.Event]]:
    relay = Recording(redis, keys, await catalog_of(redis, keys, BOARDS), settings)
    stop = asyncio.Event()
    task = asyncio.create_task(relay._pump(stop))
    try:
        await until(lambda: relay.sweeps > 0)
        yield relay, stop
    finally:
        stop.set()
        relay.wake(BOARDS[0])
        await asyncio.wait_for(task, 5)


def pace(
    monkeypatch: pytest.MonkeyPatch,
    *,
    sweep: float,
    claim: float | None = None,
    turn: int | None = None,
) -> None:
    """Sweep every ``sweep`` seconds; claim every ``claim``, ``turn`` boards a sweep, where
    given (else as the relay does)."""
    monkeypatch.setattr(outbox, "_SWEEP_SECONDS", sweep)
    if claim is not None:
        monkeypatch.setattr(outbox, "_CLAIM_EVERY_SECONDS", claim)
    if turn is not None:
        monkeypatch.setattr(relaying, "SWEEP_MOST", turn)


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    pace(monkeypatch, sweep=60.0, claim=60.0)


@pytest.mark.usefixtures("no_sweep")
async def test_a_write_wakes_a_read_of_its_board_alone_until_it_finds_nothing(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    async with pumping(redis, keys, settings) as (relay, _):
        relay.reads.clear()
        await write(redis, keys, "b07", 5)
        relay.wake("b07")
        await until(lambda: relay.reads.count("b07") >= 2)
        await asyncio.sleep(0.1)

        # Read once with its entries, once more to find it empty; no other board is read.
        assert relay.reads == ["b07", "b07"]


async def test_a_sweep_reads_the_outboxes_holding_entries_and_no_other(
    redis: Redis, keys: Keys, settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    pace(monkeypatch, sweep=0.02)
    async with pumping(redis, keys, settings) as (relay, _):
        swept = relay.sweeps
        await until(lambda: relay.sweeps >= swept + 5)
        assert relay.reads == []

        # Written by another process, which died before its relay read them.
        await write(redis, keys, "b13", 3)
        await drained(redis, keys, "b13")
        assert set(relay.reads) == {"b13"}


@pytest.mark.usefixtures("no_sweep")
async def test_every_outbox_holding_entries_is_drained_on_the_way_out(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    async with pumping(redis, keys, settings) as (relay, stop):
        await write(redis, keys, "b03", 2)
        await write(redis, keys, "b19", 4)
        stop.set()
        relay.wake("b00")
        await until(lambda: {"b03", "b19"} <= set(relay.reads))

    for board_id in ("b03", "b19"):
        assert await redis.xlen(keys.outbox(board_id)) == 0


@pytest.mark.timing
@pytest.mark.usefixtures("no_sweep")
async def test_after_less_than_a_message_the_next_read_waits_as_long_as_eight_reads_take(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    async with pumping(redis, keys, settings) as (relay, _):
        relay.took = 0.005
        for entries in (5, settings.relay_batch):
            relay.reads.clear()
            relay.read_at.clear()
            await write(redis, keys, "b07", entries)
            relay.wake("b07")
            await until(lambda: len(relay.reads) >= 2)
            waited = relay.read_at[1] - relay.read_at[0]
            if entries < settings.relay_batch:
                assert waited >= 0.04  # eight reads of 5 ms
            else:
                assert waited < 0.04  # a message's worth: read again at once


async def test_a_sweep_asks_about_a_bounded_turn_of_the_boards_and_finds_entries_in_any(
    redis: Redis, keys: Keys, settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    pace(monkeypatch, sweep=0.02, claim=60.0, turn=6)
    async with pumping(redis, keys, settings) as (relay, _):
        # The first pass claims, and a claim asks about every board.
        assert relay.swept[0] == BOARDS
        await until(lambda: len(relay.swept) >= 9)
        turns = relay.swept[1:9]
        assert all(len(turn) == 6 for turn in turns)
        # Four sweeps in a row ask about every board (20 of them, 6 a sweep), in order.
        for first in range(len(turns) - 3):
            assert set().union(*turns[first : first + 4]) == set(BOARDS)
        assert turns[0] + turns[1] + turns[2] + turns[3][:2] == BOARDS

        # Written by another process, which died before its relay read them, on boards in
        # different turns.
        await write(redis, keys, "b01", 2)
        await write(redis, keys, "b17", 2)
        await drained(redis, keys, "b01", "b17")
        assert {"b01", "b17"} <= set(relay.reads)


async def test_a_claim_asks_about_every_board_in_pipelines_of_a_turn_each(
    redis: Redis, keys: Keys, settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every sweep comes when a claim is due: each is a claim.
    pace(monkeypatch, sweep=0.03, claim=0.01, turn=6)
    async with pumping(redis, keys, settings) as (relay, _):
        await until(lambda: len(relay.swept) >= 3)
        assert all(turn == BOARDS for turn in relay.swept)

        # In the first pipeline and in the last (of four).
        await write(redis, keys, "b00", 1)
        await write(redis, keys, "b19", 1)
        await until(lambda: {"b00", "b19"} <= set(relay.reads))
