"""The history handlers on large and mixed batches: the event log's counts across statements,
and the views marked for a batch whose events differ in board, region, team and period."""

from __future__ import annotations

import orjson
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.handlers import CHUNK_ROWS, HistoryHandler, MarkChangedViews
from services.history.snapshotter import changed_views
from shared.db import count_events, score_events
from shared.keys import Keys
from shared.ranking import MAX_SCORE
from tests.helpers import accepted_event as stored_event
from tests.history.test_history import counted
from tests.history.test_snapshots import WEEK, accepted, dirty


async def test_a_batch_of_several_statements_counts_each_row_once(db: AsyncEngine) -> None:
    handler = HistoryHandler(db)
    total = 2 * CHUNK_ROWS + 500
    batch = [stored_event(f"e-{i}", user_id=f"u-{i % 7}", value=i) for i in range(total - 1)]
    # Stored as given: the driver substitutes parameters into the statement's text itself. The
    # value and subscore at the bounds of the range (docs/api.md section 1).
    tricky = "50% %s %(x)s 'q' \\ \"d\" ;"
    metadata = {tricky: [tricky, {"%s": None}], "n": -MAX_SCORE}
    batch.append(
        stored_event("e-tricky", display_name=tricky, value=-MAX_SCORE).model_copy(
            update={"subscore": MAX_SCORE, "metadata": metadata}
        )
    )
    await handler(batch[::3])  # a third of them arrived before
    inserted, duplicates = counted("inserted"), counted("duplicate")

    await handler(batch)

    assert await count_events(db, "main") == total
    assert counted("duplicate") - duplicates == len(batch[::3])
    assert counted("inserted") - inserted == total - len(batch[::3])
    async with db.connect() as conn:
        row = (
            await conn.execute(
                select(
                    score_events.c.display_name,
                    score_events.c.value,
                    score_events.c.subscore,
                    score_events.c.metadata,
                ).where(score_events.c.event_id == "e-tricky")
            )
        ).one()
    assert (row.display_name, row.value, row.subscore) == (tricky, -MAX_SCORE, MAX_SCORE)
    assert row.metadata == orjson.dumps(metadata).decode()


async def test_a_mixed_batch_marks_every_view_of_every_event(redis: Redis, keys: Keys) -> None:
    day, next_day = ("daily", "2026-11-29"), ("daily", "2026-11-30")
    batch = [
        accepted(periods=(day, ("alltime", "all"))),
        accepted("u-2", team_id="red", periods=(day, ("alltime", "all"))),
        accepted("u-3", region="us", periods=(day, ("alltime", "all"))),
        # Midnight passed within the batch: the same region and team, a new daily period.
        accepted("u-4", team_id="red", periods=(next_day, ("alltime", "all"))),
        accepted("u-5", periods=(("weekly", WEEK),)),
        accepted(board_id="laps", region="us", team_id="blue", periods=(("alltime", "all"),)),
        accepted("u-6", periods=(day, ("alltime", "all"))),
    ]

    await MarkChangedViews(redis, keys)(batch)

    for board_id in ("main", "laps"):
        expected = {m for e in batch if e.board_id == board_id for m in changed_views(e)}
        assert await dirty(redis, keys, board_id) == expected
    assert "daily|2026-11-30|teams" in await dirty(redis, keys)
