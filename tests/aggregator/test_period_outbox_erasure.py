"""A user erased while ``period.closed`` messages naming it wait in a period outbox (docs/api.md
section 8b, "Erasing a user"): each goes out without the user's entries, the others keeping the
ranks they were taken with; one that named nobody else goes out not at all, as a period nobody
else scored in closes without a message. A deleted board's parked outbox is rewritten too."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from services.aggregator.period_relay import PeriodRelay
from services.api.erased_periods import without_user
from services.api.eraser import Eraser
from shared.amqp import connect as connect_broker
from shared.boards import Board, BoardCatalog
from shared.db import open_engine
from shared.functions import ERASE_PERIOD_MESSAGES_FUNCTION, PUBLISHING_PERIOD_FUNCTION
from shared.keys import Keys
from shared.parked_periods import parked_outbox, parked_set, publishing_marks
from shared.settings import LadderSettings
from shared.topology import Topology

CUP = Board(board_id="cup", periods=("daily",), regions=("eu",))


@pytest.fixture
def settings(settings: LadderSettings, mysql_database: str) -> LadderSettings:
    return settings


def entry(rank: int, user_id: str, score: int) -> dict[str, Any]:
    return {"rank": rank, "user_id": user_id, "score": score, "display_name": user_id}


def message(board_id: str, period_id: str, users: list[str]) -> dict[str, str]:
    """An outbox entry as the close queues it: ``users`` ranked in that order."""
    top = [entry(n, user, 100 - n) for n, user in enumerate(users, 1)]
    body = {
        "schema": 1,
        "type": "period.closed",
        "board_id": board_id,
        "period": "daily",
        "period_id": period_id,
        "closed_at": "2026-12-02T00:10:03.000Z",
        "scopes": {"global": top, "region:eu": top[1:], "region:na": []},
    }
    return {"m": orjson.dumps(body).decode(), "i": f"{board_id}:daily:{period_id}"}


async def test_an_erased_user_is_left_out_of_the_messages_still_waiting(
    settings: LadderSettings, redis: Redis, keys: Keys, broker: Topology
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(CUP)
    outbox = keys.periods_outbox("cup")
    await redis.xadd(outbox, message("cup", "2026-12-01", ["a", "x", "b"]))
    await redis.xadd(outbox, message("cup", "2026-12-02", ["x"]))
    await redis.xadd(outbox, message("cup", "2026-12-03", ["a"]))
    # A deleted board's outbox, parked by its deletion.
    parked = parked_outbox(keys, "old", 1_700_000_000_000)
    await redis.xadd(parked, message("old", "2026-11-30", ["x", "a"]))
    await redis.sadd(parked_set(keys), parked)
    relay = PeriodRelay(redis, keys, catalog, settings)
    stop = asyncio.Event()
    running = asyncio.create_task(relay.relay_until(stop))
    try:
        connection = await connect_broker(settings.amqp_urls)
        async with connection, open_engine(settings.mysql_url) as engine:
            channel = await connection.channel()
            exchange = await broker.declare_periods_exchange(channel)
            await asyncio.sleep(1.5)  # published mandatory to no queue: they wait, pending
            eraser = Eraser(engine, redis, keys, catalog, 0)
            await eraser.erase_user("x", datetime.now(UTC))
            tap = await channel.declare_queue(exclusive=True)
            await tap.bind(exchange)
            got: dict[str, list[Any]] = {}
            for _ in range(30):
                await asyncio.sleep(0.1)
                while (one := await tap.get(no_ack=True, fail=False)) is not None:
                    got.setdefault(str(one.message_id), []).append(orjson.loads(one.body))
                if len(got) == 3:
                    break
            await asyncio.sleep(1.5)
            while (one := await tap.get(no_ack=True, fail=False)) is not None:
                got.setdefault(str(one.message_id), []).append(orjson.loads(one.body))
            assert sorted(got) == [
                "cup:daily:2026-12-01",
                "cup:daily:2026-12-03",
                "old:daily:2026-11-30",
            ]
            assert [len(bodies) for bodies in got.values()] == [1, 1, 1]
            ranked = {
                mid: {s: [(e["user_id"], e["rank"]) for e in es] for s, es in b["scopes"].items()}
                for mid, [b] in got.items()
            }
            assert ranked == {
                "cup:daily:2026-12-01": {
                    "global": [("a", 1), ("b", 3)],
                    "region:eu": [("b", 3)],
                    "region:na": [],
                },
                "cup:daily:2026-12-03": {"global": [("a", 1)], "region:eu": [], "region:na": []},
                "old:daily:2026-11-30": {
                    "global": [("a", 2)],
                    "region:eu": [("a", 2)],
                    "region:na": [],
                },
            }
            assert await redis.xlen(outbox) == 0
            assert not await redis.exists(parked)
    finally:
        stop.set()
        await running


async def test_a_message_changed_or_published_since_it_was_read_is_left_alone(
    redis: Redis, keys: Keys
) -> None:
    outbox = keys.periods_outbox("cup")
    read = message("cup", "2026-12-01", ["a", "x"])
    entry_id = await redis.xadd(outbox, read)
    rewritten = without_user(read["m"], "x")
    assert rewritten is not None
    assert [e["user_id"] for e in orjson.loads(rewritten)["scopes"]["global"]] == ["a"]
    # Another message under the id than the one read: not replaced.
    swap, marks = ERASE_PERIOD_MESSAGES_FUNCTION, publishing_marks(outbox)
    assert await redis.fcall(swap, 2, outbox, marks, entry_id, read["m"] + " ", rewritten) == [0, 0]
    assert [f["m"] for _, f in await redis.xrange(outbox)] == [read["m"]]
    # Being published (the relay's mark): not replaced, and counted as such.
    mark = PUBLISHING_PERIOD_FUNCTION
    assert await redis.fcall(mark, 2, outbox, marks, entry_id, 15_000) == 1
    assert await redis.fcall(swap, 2, outbox, marks, entry_id, read["m"], rewritten) == [0, 1]
    assert [f["m"] for _, f in await redis.xrange(outbox)] == [read["m"]]
    # Published and deleted meanwhile: nothing comes back.
    await redis.xdel(outbox, entry_id)
    await redis.hdel(marks, entry_id)
    assert await redis.fcall(swap, 2, outbox, marks, entry_id, read["m"], rewritten) == [0, 0]
    assert await redis.xlen(outbox) == 0
    # Nor is an entry gone marked: the relay does not publish it.
    assert await redis.fcall(mark, 2, outbox, marks, entry_id, 15_000) == 0
    assert not await redis.exists(marks)


async def test_a_mark_left_by_a_relay_that_died_lapses(redis: Redis, keys: Keys) -> None:
    outbox = keys.periods_outbox("cup")
    marks = publishing_marks(outbox)
    read = message("cup", "2026-12-01", ["a", "x"])
    entry_id = await redis.xadd(outbox, read)
    rewritten = without_user(read["m"], "x")
    assert rewritten is not None
    assert await redis.fcall(PUBLISHING_PERIOD_FUNCTION, 2, outbox, marks, entry_id, 200) == 1
    swap = ERASE_PERIOD_MESSAGES_FUNCTION
    assert await redis.fcall(swap, 2, outbox, marks, entry_id, read["m"], rewritten) == [0, 1]
    await asyncio.sleep(0.3)
    assert await redis.fcall(swap, 2, outbox, marks, entry_id, read["m"], rewritten) == [1, 0]
    assert [f["m"] for _, f in await redis.xrange(outbox)] == [rewritten]
