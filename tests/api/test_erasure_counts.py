"""An erased user's events taken out of the event counters (``stats``), each once and only if
the aggregator's derive step counted it: by the history consumer for those it leaves out, and by
the erasure's pass (services/api/erased_counts.py, shared/uncount.py)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from services.api.eraser import Eraser
from services.history.handlers import HistoryHandler
from shared.boards import MAIN_BOARD, BoardCatalog
from shared.db import count_events, open_engine
from shared.erasure import request_erasure
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.periods import window_at
from shared.settings import LadderSettings
from shared.uncount import Uncount
from tests.api.helpers import post, score
from tests.helpers import accepted_event, api_client, derive_outbox


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def test_each_counted_event_is_taken_out_once_and_no_other(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    counter = keys.event_count("main", "alltime", "all")
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await post(client, score(user_id="u-x", event_id="e-1"))
        await post(client, score(user_id="u-2", event_id="e-2"))
        assert await derive_outbox(redis, keys, MAIN_BOARD, quiet.feed_length) == 2
        await post(client, score(user_id="u-x", event_id="e-3"))  # not derived: never counted
        entries: list[Any] = await redis.xrange(keys.outbox("main"))
        by_id = {
            e.event_id: e for e in (ScoreAccepted.model_validate_json(f["e"]) for _, f in entries)
        }
        # An event stored long ago, its record expired, counted when it was derived.
        await HistoryHandler(engine)([accepted_event("h-1", user_id="u-x")])
        await redis.incr(counter)
        assert await redis.get(counter) == "3"

        erasure = await request_erasure(engine, redis, keys, "u-x", quiet.effective_jwt_secret)
        # The history consumer leaves e-1 and e-3 out, on every delivery of them.
        uncount = Uncount(redis, keys)
        for _ in range(2):
            await uncount([by_id["e-1"], by_id["e-3"]])
            assert await redis.get(counter) == "2"

        eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
        for _ in range(2):  # both passes: h-1 by its row, once; e-1 was taken out already
            await eraser.erase_user("u-x", erasure.cutoff)
            assert await redis.get(counter) == "1"
        assert await count_events(engine, "main", user_id="u-x") == 0
        assert not await redis.exists(keys.idempotency("main", "e-1", "u-x"))
        assert not await redis.exists(keys.idempotency("main", "e-3", "u-x"))


async def test_the_pass_takes_out_a_counted_event_the_history_has_not_seen(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """An event derived before the erasure and still in the history consumer's queue: the pass
    takes it out by its record, which it deletes; the consumer, finding no record, takes
    nothing."""
    counter = keys.event_count("main", "alltime", "all")
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        await post(client, score(user_id="u-x", event_id="e-1"))
        await post(client, score(user_id="u-2", event_id="e-2"))
        assert await derive_outbox(redis, keys, MAIN_BOARD, quiet.feed_length) == 2
        entries: list[Any] = await redis.xrange(keys.outbox("main"))
        first = ScoreAccepted.model_validate_json(entries[0][1]["e"])

        erasure = await request_erasure(engine, redis, keys, "u-x", quiet.effective_jwt_secret)
        eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
        await eraser.erase_user("u-x", erasure.cutoff)
        assert await redis.get(counter) == "1"
        await Uncount(redis, keys)([first])
        await eraser.erase_user("u-x", erasure.cutoff)
        assert await redis.get(counter) == "1"


async def test_a_stored_event_is_taken_out_of_the_periods_it_was_written_to(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """An event whose record expired, written when the board kept only its all-time period (its
    stored periods say so): the pass takes it out of that one, not out of the daily counter of
    its day, which counts other events."""
    event = accepted_event("h-1", user_id="u-x")  # written to alltime alone
    day = window_at("daily", event.occurred_at, "UTC").period_id
    daily, alltime = (
        keys.event_count("main", "daily", day),
        keys.event_count("main", "alltime", "all"),
    )
    async with api_client(quiet), open_engine(quiet.mysql_url) as engine:
        await HistoryHandler(engine)([event])
        await redis.set(alltime, 1)
        await redis.set(daily, 1)

        erasure = await request_erasure(engine, redis, keys, "u-x", quiet.effective_jwt_secret)
        await Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0).erase_user(
            "u-x", erasure.cutoff
        )
        assert await count_events(engine, "main", user_id="u-x") == 0
    assert int(await redis.get(alltime) or 0) == 0
    assert await redis.get(daily) == "1"
