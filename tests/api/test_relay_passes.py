"""Which outboxes the relay reads, and when (services/api/relay/outbox.py): a write wakes a read
of its own board's outbox, not of every board's, read again while it finds entries; every
board's outbox is read on a sweep, so that entries another process wrote and left are relayed;
and every board's is drained on the way out.

The broker is not needed to tell which outbox is read when: each read is recorded and takes what
the test put in that board's outbox (``Relay._relay_board`` is the one step that reads one)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis

from services.api.relay import outbox
from services.api.relay.outbox import Relay
from shared.boards import Board, BoardCatalog
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import eventually

BOARDS = [f"b{i:02}" for i in range(20)]


async def until(condition: Callable[[], bool]) -> None:
    async def holds() -> bool:
        return condition()

    await eventually(holds)


class Recording(Relay):
    """A relay whose reads are recorded; a read of a board takes the entries left for it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.reads: list[str] = []
        self.waiting: dict[str, int] = {}

    async def _relay_board(self, board_id: str, claim: bool) -> int:
        self.reads.append(board_id)
        return self.waiting.pop(board_id, 0)


@contextlib.asynccontextmanager
async def pumping(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> AsyncIterator[tuple[Recording, asyncio.Event]]:
    catalog = BoardCatalog(redis, keys)
    for board_id in BOARDS:
        await catalog.put(Board(board_id=board_id))
    relay = Recording(redis, keys, catalog, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(relay._pump(stop))
    try:
        # The first pass reads every board.
        await until(lambda: set(BOARDS) <= set(relay.reads))
        yield relay, stop
    finally:
        stop.set()
        relay.wake(BOARDS[0])
        await asyncio.wait_for(task, 5)


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "_SWEEP_SECONDS", 60.0)
    monkeypatch.setattr(outbox, "_CLAIM_EVERY_SECONDS", 60.0)


@pytest.mark.usefixtures("no_sweep")
async def test_a_write_wakes_a_read_of_its_board_alone_until_it_finds_nothing(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    async with pumping(redis, keys, settings) as (relay, _):
        relay.reads.clear()
        relay.waiting["b07"] = 5
        relay.wake("b07")
        await until(lambda: relay.reads.count("b07") >= 2)
        await asyncio.sleep(0.1)

        # Read once with its entries, once more to find it empty; no other board is read.
        assert relay.reads == ["b07", "b07"]


async def test_a_sweep_reads_the_outbox_of_a_board_no_write_woke(
    redis: Redis, keys: Keys, settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox, "_SWEEP_SECONDS", 0.05)
    async with pumping(redis, keys, settings) as (relay, _):
        # Written by another process, which died before its relay read them.
        relay.waiting["b13"] = 3

        await until(lambda: "b13" not in relay.waiting)


@pytest.mark.usefixtures("no_sweep")
async def test_every_outbox_is_drained_on_the_way_out(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    async with pumping(redis, keys, settings) as (relay, stop):
        relay.waiting.update({"b03": 2, "b19": 4})
        relay.reads.clear()
        stop.set()
        relay.wake("b00")
        await until(lambda: not relay.waiting)

    assert set(BOARDS) <= set(relay.reads)
