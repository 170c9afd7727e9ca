"""A user's erasure, or a board's deletion, recorded while the notifier handles a batch
(docs/reliability.md, "Erasure and the outboxes"): the batch was filtered before the tombstone
and written after the passes, which found nothing to remove. The notifier looks again after its
write, and neither the user's badges on the board nor the event's record stay."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from services.api.eraser import Eraser
from services.notifier.handlers import Notify
from services.notifier.main import batch_handler
from shared.boards import BoardCatalog
from shared.db import open_engine
from shared.erasure import record_board_deletion, request_erasure, to_ms
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.notifier.test_badges import QUEST, accepted, add_board


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def test_a_batch_written_after_the_erasures_passes_leaves_no_badge_nor_record(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    await add_board(redis, keys, QUEST)
    catalog = BoardCatalog(redis, keys)
    secret = quiet.effective_jwt_secret
    mine, other = accepted(600, user_id="u-x"), accepted(600, user_id="u-2")
    write = Notify.__call__
    erased = []
    async with open_engine(quiet.mysql_url) as engine:

        async def erased_before_the_write(self: Notify, events: list[Any]) -> None:
            # The filter has let the batch through; the erasure is recorded and both its passes
            # run (they find no badge nor record of the event yet), then the batch is written.
            erasure = await request_erasure(engine, redis, keys, "u-x", secret)
            eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
            for _ in range(2):
                await eraser.erase_user("u-x", erasure.cutoff)
            erased.append(erasure)
            await write(self, events)

        monkeypatch.setattr(Notify, "__call__", erased_before_the_write)
        await batch_handler(redis, keys, catalog, secret)([mine, other])
    assert erased
    assert await redis.hgetall(keys.badges("quest", "u-x")) == {}
    assert not await redis.exists(keys.idempotency("quest", mine.event_id, "u-x"))
    # The other user's are its own.
    assert set(await redis.hgetall(keys.badges("quest", "u-2"))) == {"bronze", "silver"}
    assert await redis.exists(keys.idempotency("quest", other.event_id, "u-2"))


async def test_a_batch_written_after_its_boards_deletion_leaves_no_key_of_the_board(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    await add_board(redis, keys, QUEST)
    catalog = BoardCatalog(redis, keys)
    assert await catalog.get("quest") is not None  # cached, as a notifier has it
    secret = quiet.effective_jwt_secret
    event = accepted(600, user_id="u-1")
    write = Notify.__call__
    deleted = []
    async with open_engine(quiet.mysql_url) as engine:

        async def deleted_before_the_write(self: Notify, events: list[Any]) -> None:
            # The filter has let the batch through; the deletion is recorded (as the API does:
            # MySQL, then the projection) and both its passes run, then the batch is written
            # with the definition the notifier still has cached.
            async with engine.begin() as conn:
                deletion = await record_board_deletion(conn, "quest", purge=False)
            await redis.hset(keys.deleted_boards, "quest", to_ms(deletion.cutoff))
            eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
            for _ in range(2):
                await eraser.delete_boards([deletion])
            deleted.append(deletion)
            await write(self, events)

        monkeypatch.setattr(Notify, "__call__", deleted_before_the_write)
        await batch_handler(redis, keys, catalog, secret)([event])
    assert deleted
    assert await redis.hgetall(keys.badges("quest", "u-1")) == {}
    assert not await redis.exists(keys.idempotency("quest", event.event_id, "u-1"))
