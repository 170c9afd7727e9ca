"""A board's deletion with purge recorded while the history consumer stores a batch of the
board's events (docs/api.md section 8b, docs/reliability.md "Erasure and the outboxes"): the
batch's filter read the deletions before the deletion's row committed, and its insert came after
the purge's last pass, which found nothing to delete. The consumer looks again after its commit,
and the event log ends without the purged board's events, whenever the deletion came."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.api.erased_rows import purge_board
from services.history.handlers import HistoryHandler, LateErasures
from services.history.main import batch_handler
from shared.db import count_events, open_engine
from shared.erasure import finish_board_deletion, record_board_deletion
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import accepted_event


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def purged(engine: AsyncEngine, board_id: str) -> None:
    """The board's deletion with purge recorded and committed, then both its passes (the purge
    of its events up to the cut-off) and its end, as the worker runs them."""
    async with engine.begin() as conn:
        deletion = await record_board_deletion(conn, board_id, purge=True)
    for _ in range(2):
        await purge_board(engine, deletion)
    await finish_board_deletion(engine, deletion)


def batch() -> list[Any]:
    return [
        accepted_event("e-1", board_id="quest", user_id="u-1"),
        accepted_event("e-2", board_id="laps", user_id="u-1"),
    ]


async def test_a_batch_stored_after_its_boards_purge_leaves_none_of_its_events(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion committed between the filter and the store's transaction, which reads it."""
    store = HistoryHandler.__call__
    async with open_engine(quiet.mysql_url, changed_rows=True) as engine:

        async def purged_before_the_store(self: HistoryHandler, events: list[Any]) -> None:
            await purged(engine, "quest")
            await store(self, events)

        monkeypatch.setattr(HistoryHandler, "__call__", purged_before_the_store)
        await batch_handler(engine, redis, keys, quiet)(batch())
        assert await count_events(engine, "quest") == 0
        assert await count_events(engine, "laps") == 1


async def test_a_purge_between_the_stores_read_and_its_insert_leaves_none_of_its_events(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion committed after the store's transaction read the deletions and before its
    insert: a check of the purge in that transaction would not see it."""
    insert = AsyncConnection.exec_driver_sql
    done: list[bool] = []
    async with open_engine(quiet.mysql_url, changed_rows=True) as engine:

        async def purged_before_the_insert(self: AsyncConnection, *args: Any, **kw: Any) -> Any:
            if not done:
                done.append(True)
                await purged(engine, "quest")
            return await insert(self, *args, **kw)

        monkeypatch.setattr(AsyncConnection, "exec_driver_sql", purged_before_the_insert)
        await batch_handler(engine, redis, keys, quiet)(batch())
        assert done
        assert await count_events(engine, "quest") == 0
        assert await count_events(engine, "laps") == 1


async def test_a_redelivery_after_a_failed_look_leaves_none_of_the_purged_boards_events(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look after the store failed (MySQL away a moment): the broker delivers the batch
    again, whose filter now leaves the purged board's events out. The look is given the whole
    batch, and deletes the rows the first delivery stored; given the kept events alone, it
    never saw them, and they stayed."""
    store, look = HistoryHandler.__call__, LateErasures.purges
    failed: list[bool] = []
    async with open_engine(quiet.mysql_url, changed_rows=True) as engine:

        async def purged_before_the_store(self: HistoryHandler, events: list[Any]) -> None:
            if not failed:
                await purged(engine, "quest")
            await store(self, events)

        async def failing_once(self: LateErasures, events: list[Any]) -> None:
            if not failed:
                failed.append(True)
                raise ConnectionError("the history database went away")
            await look(self, events)

        monkeypatch.setattr(HistoryHandler, "__call__", purged_before_the_store)
        monkeypatch.setattr(LateErasures, "purges", failing_once)
        handler = batch_handler(engine, redis, keys, quiet)
        with pytest.raises(ConnectionError):
            await handler(batch())
        assert await count_events(engine, "quest") == 1  # stored; its look failed
        await handler(batch())  # delivered again
        assert await count_events(engine, "quest") == 0
        assert await count_events(engine, "laps") == 1
