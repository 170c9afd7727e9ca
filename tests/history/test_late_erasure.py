"""A user's erasure recorded while the history consumer stores a batch of the user's events
(docs/reliability.md, "Erasure and the outboxes"): the batch was filtered before the tombstone
and stored after the erasure's passes, which found nothing to delete. The consumer looks again
after its commit, and the event log ends without the user's events, its counters counting each
once, whatever the timing."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from services.api.eraser import Eraser
from services.history.handlers import HistoryHandler, LateErasures
from services.history.main import batch_handler
from shared.boards import MAIN_BOARD, BoardCatalog
from shared.db import count_events, open_engine
from shared.erasure import request_erasure
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import post, score
from tests.helpers import api_client, derive_outbox


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def test_a_batch_stored_after_the_erasures_passes_leaves_none_of_the_users_events(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = keys.event_count("main", "alltime", "all")
    async with (
        api_client(quiet) as client,
        open_engine(quiet.mysql_url, changed_rows=True) as engine,
    ):
        await post(client, score(user_id="u-x", event_id="e-1"))
        await post(client, score(user_id="u-2", event_id="e-2"))
        assert await derive_outbox(redis, keys, MAIN_BOARD, quiet.feed_length) == 2
        entries: list[Any] = await redis.xrange(keys.outbox("main"))
        batch = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
        store = HistoryHandler.__call__
        erasures = []

        async def erased_before_the_store(self: HistoryHandler, events: list[Any]) -> None:
            # The filter has let the batch through; the erasure is recorded and both its passes
            # run (they find no row of the user yet), then the batch is stored.
            erasure = await request_erasure(engine, redis, keys, "u-x", quiet.effective_jwt_secret)
            eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
            for _ in range(2):
                await eraser.erase_user("u-x", erasure.cutoff)
            erasures.append(erasure)
            await store(self, events)

        monkeypatch.setattr(HistoryHandler, "__call__", erased_before_the_store)
        await batch_handler(engine, redis, keys, quiet)(batch)
        assert erasures
        assert await count_events(engine, "main", user_id="u-x") == 0
        assert await count_events(engine, "main", user_id="u-2") == 1
        # e-1 was taken out of the counter once, by the erasure's pass.
        assert await redis.get(counter) == "1"

        # Delivered again (a crash before the ack): the filter leaves it out now.
        monkeypatch.setattr(HistoryHandler, "__call__", store)
        await batch_handler(engine, redis, keys, quiet)(batch)
        assert await count_events(engine, "main", user_id="u-x") == 0
        assert await count_events(engine, "main", user_id="u-2") == 1
        assert await redis.get(counter) == "1"


async def test_a_batch_whose_look_failed_after_its_store_is_deleted_when_delivered_again(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store committed, then the look failed (MySQL lost at that moment): the batch comes
    again, and the filter, which sees the tombstone now, leaves the user's events out of the
    store; the rows the first delivery stored are deleted all the same."""
    async with (
        api_client(quiet) as client,
        open_engine(quiet.mysql_url, changed_rows=True) as engine,
    ):
        await post(client, score(user_id="u-x", event_id="e-1"))
        await post(client, score(user_id="u-2", event_id="e-2"))
        entries: list[Any] = await redis.xrange(keys.outbox("main"))
        batch = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
        store = HistoryHandler.__call__

        async def erased_before_the_store(self: HistoryHandler, events: list[Any]) -> None:
            await request_erasure(engine, redis, keys, "u-x", quiet.effective_jwt_secret)
            await store(self, events)

        async def lost(self: LateErasures, events: list[Any]) -> None:
            raise ConnectionError("MySQL went away")

        monkeypatch.setattr(HistoryHandler, "__call__", erased_before_the_store)
        monkeypatch.setattr(LateErasures, "__call__", lost)
        with pytest.raises(ConnectionError):
            await batch_handler(engine, redis, keys, quiet)(batch)
        assert await count_events(engine, "main", user_id="u-x") == 1
        monkeypatch.undo()
        await batch_handler(engine, redis, keys, quiet)(batch)
        assert await count_events(engine, "main", user_id="u-x") == 0
        assert await count_events(engine, "main", user_id="u-2") == 1
