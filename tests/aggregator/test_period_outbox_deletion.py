"""A board deleted while ``period.closed`` messages wait in its period outbox (docs/api.md
section 8b): each still goes out, once, when a queue is bound to ``ladder.periods``; nothing of
it stays once out, and a fresh board of the name sends its own messages beside them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from services.aggregator.period_relay import PeriodRelay
from services.api.eraser import Eraser
from shared.amqp import connect as connect_broker
from shared.boards import Board, BoardCatalog
from shared.erasure import BoardDeletion, to_ms
from shared.keys import Keys
from shared.parked_periods import park, parked_outbox, parked_set
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import eventually

CUP = Board(board_id="cup", periods=("daily",))


def message(period_id: str) -> dict[str, str]:
    """An outbox entry as the close queues it, of the board's daily period ``period_id``."""
    body = {
        "schema": 1,
        "type": "period.closed",
        "board_id": "cup",
        "period": "daily",
        "period_id": period_id,
        "closed_at": "2026-12-02T00:10:03.000Z",
        "scopes": {"global": [{"rank": 1, "user_id": "a", "score": 5}]},
    }
    return {"m": orjson.dumps(body).decode(), "i": f"cup:daily:{period_id}"}


# A deletion of board "cup", and the worker that makes its passes (no MySQL: no purge).
DELETION = BoardDeletion("cup", datetime(2026, 12, 1, tzinfo=UTC), False, None)


@pytest.fixture
def eraser(redis: Redis, keys: Keys) -> Eraser:
    return Eraser(None, redis, keys, BoardCatalog(redis, keys), 0)  # type: ignore[arg-type]


async def board_keys(redis: Redis, keys: Keys) -> list[Any]:
    return [key async for key in redis.scan_iter(match=keys.board_match("cup"))]


async def test_a_board_deleted_with_messages_waiting_still_sends_each_once(
    settings: LadderSettings, redis: Redis, keys: Keys, broker: Topology
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(CUP)
    await redis.xadd(keys.periods_outbox("cup"), message("2026-12-01"))
    relay = PeriodRelay(redis, keys, catalog, settings)
    stop = asyncio.Event()
    running = asyncio.create_task(relay.relay_until(stop))
    eraser = Eraser(None, redis, keys, catalog, 0)  # type: ignore[arg-type]
    try:
        connection = await connect_broker(settings.amqp_urls)
        async with connection:
            channel = await connection.channel()
            exchange = await broker.declare_periods_exchange(channel)
            await asyncio.sleep(1.5)  # published mandatory to no queue: it waits, pending
            assert await redis.xlen(keys.periods_outbox("cup")) == 1
            # The board deleted (both passes), then made afresh, which closes a period of its own.
            deletion = BoardDeletion("cup", datetime.now(UTC), False, None)
            await eraser.delete_boards([deletion])
            await eraser.delete_boards([deletion])
            await catalog.put(CUP)
            await redis.xadd(keys.periods_outbox("cup"), message("2026-12-05"))
            tap = await channel.declare_queue(exclusive=True)
            await tap.bind(exchange)
            got: list[str | None] = []
            for _ in range(100):
                one = await tap.get(no_ack=True, fail=False)
                if one is not None:
                    got.append(one.message_id)
                if len(got) == 2:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2)
            while (one := await tap.get(no_ack=True, fail=False)) is not None:
                got.append(one.message_id)
            assert sorted(got) == ["cup:daily:2026-12-01", "cup:daily:2026-12-05"]
            # Nothing of the deleted board's outbox stays once its messages are out.
            assert await redis.xlen(keys.periods_outbox("cup")) == 0
            assert [k for k in await board_keys(redis, keys) if "periods" in k] in (
                [],
                [keys.periods_outbox("cup")],
            )
            assert await redis.scard(parked_set(keys)) == 0
    finally:
        stop.set()
        await running


async def test_each_deletion_parks_what_waits_and_leaves_what_an_earlier_one_parked(
    redis: Redis, keys: Keys, eraser: Eraser
) -> None:
    first = DELETION
    second = BoardDeletion("cup", datetime(2026, 12, 3, tzinfo=UTC), False, None)
    outbox = keys.periods_outbox("cup")
    await redis.xadd(outbox, message("2026-11-30"))
    await eraser.delete_boards([first])
    # A process that still had the board cached closes a period after the first pass: the
    # second pass of the same deletion appends it to what the first parked.
    await redis.xadd(outbox, message("2026-12-01"))
    await eraser.delete_boards([first])
    # A fresh board of the name, deleted in turn with a message waiting.
    await BoardCatalog(redis, keys).put(CUP)
    await redis.xadd(outbox, message("2026-12-02"))
    await eraser.delete_boards([second])
    older, newer = (
        parked_outbox(keys, "cup", to_ms(first.cutoff)),
        parked_outbox(keys, "cup", to_ms(second.cutoff)),
    )
    assert sorted(await board_keys(redis, keys)) == sorted([older, newer])
    assert await redis.smembers(parked_set(keys)) == {older, newer}
    ids = {k: [f["i"] for _, f in await redis.xrange(k)] for k in (older, newer)}
    assert ids == {
        older: ["cup:daily:2026-11-30", "cup:daily:2026-12-01"],
        newer: ["cup:daily:2026-12-02"],
    }


async def test_a_deletion_notes_a_parked_outbox_only_where_it_parked_entries(
    redis: Redis, keys: Keys, eraser: Eraser
) -> None:
    deletion = DELETION
    parked = parked_outbox(keys, "cup", to_ms(deletion.cutoff))
    # No period outbox at all, then an empty one (every message published): nothing is noted.
    assert await park(redis, keys, "cup", to_ms(deletion.cutoff)) == 0
    await redis.xadd(keys.periods_outbox("cup"), message("2026-11-30"))
    await redis.xtrim(keys.periods_outbox("cup"), maxlen=0)
    await eraser.delete_boards([deletion])
    assert await redis.smembers(parked_set(keys)) == set()
    assert await board_keys(redis, keys) == []
    # A message waiting at the second pass: parked and noted.
    await redis.xadd(keys.periods_outbox("cup"), message("2026-12-01"))
    assert await park(redis, keys, "cup", to_ms(deletion.cutoff)) == 1
    assert await redis.smembers(parked_set(keys)) == {parked}
    # Parked already, nothing more waiting: the name stays as it is.
    assert await park(redis, keys, "cup", to_ms(deletion.cutoff)) == 0
    assert await redis.smembers(parked_set(keys)) == {parked}


async def test_a_message_queued_between_the_park_and_the_scan_is_parked_not_unlinked(
    redis: Redis, keys: Keys, eraser: Eraser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close that read the board's definition before the deletion removed it queues its
    message after the pass parked the outbox, while the pass scans the board's keys to remove
    them: the message is parked (and goes out), not removed with the board's keys."""
    await BoardCatalog(redis, keys).put(CUP)
    deletion = DELETION
    outbox = keys.periods_outbox("cup")
    await redis.set(keys.period_watermark("cup", "daily"), 1)  # a key of the board, to scan
    scan_iter = type(redis).scan_iter

    async def closed_meanwhile(self: Redis, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        await redis.xadd(outbox, message("2026-11-30"))
        async for key in scan_iter(self, *args, **kwargs):
            yield key

    monkeypatch.setattr(type(redis), "scan_iter", closed_meanwhile)
    await eraser.delete_boards([deletion])
    monkeypatch.undo()
    parked = parked_outbox(keys, "cup", to_ms(deletion.cutoff))
    assert [f["i"] for _, f in await redis.xrange(parked)] == ["cup:daily:2026-11-30"]
    assert await redis.smembers(parked_set(keys)) == {parked}
    assert await board_keys(redis, keys) == [parked]


async def test_a_board_made_again_says_again_that_its_first_message_waits_for_a_queue(
    settings: LadderSettings, redis: Redis, keys: Keys, broker: Topology
) -> None:
    """The relay says once that an outbox's message waits for a queue; a board deleted then
    made again under the name is another board, whose first waiting message is said again."""
    catalog = BoardCatalog(redis, keys)
    await catalog.put(CUP)
    outbox = keys.periods_outbox("cup")
    await redis.xadd(outbox, message("2026-12-01"))
    relay = PeriodRelay(redis, keys, catalog, settings)
    stop = asyncio.Event()
    eraser = Eraser(None, redis, keys, catalog, 0)  # type: ignore[arg-type]
    waiting = "period.closed routed to no queue; it waits"
    with capture_logs() as logs:

        def said(count: int) -> Any:
            async def probe() -> list[str] | None:
                streams = [e["stream"] for e in logs if e["event"] == waiting]
                return streams if len(streams) >= count else None

            return probe

        running = asyncio.create_task(relay.relay_until(stop))
        try:
            await eventually(said(1))  # no queue bound to ladder.periods: it waits
            deletion = BoardDeletion("cup", datetime.now(UTC), False, None)
            await eraser.delete_boards([deletion])
            await eraser.delete_boards([deletion])
            await eventually(said(2))  # the parked outbox's message waits in turn
            await asyncio.sleep(1.0)  # two more of the relay's passes see the board gone
            await catalog.put(CUP)
            await redis.xadd(outbox, message("2026-12-05"))
            streams = await eventually(said(3))
        finally:
            stop.set()
            await running
    parked = parked_outbox(keys, "cup", to_ms(deletion.cutoff))
    assert streams == [outbox, parked, outbox]
    assert await redis.xlen(outbox) == 1
    assert await redis.xlen(parked) == 1
