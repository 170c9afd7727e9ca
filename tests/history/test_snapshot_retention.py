"""Snapshots older than ``LADDER_SNAPSHOT_RETENTION_DAYS`` deleted by the history service
(services/history/snapshot_retention.py), their users' rows with them; 0 keeps them all."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history import snapshot_retention
from services.history.snapshot_retention import EXPIRED, expire, until_stopped
from shared.db import snapshot_users, snapshots
from shared.db_boards import save_snapshots, snapshot_at
from shared.events import rfc3339
from shared.settings import LadderSettings
from tests.helpers import T0, eventually
from tests.history.test_snapshot_users import shot

NOW = T0 + timedelta(days=30)


async def kept(db: AsyncEngine) -> list[tuple[str, str, int]]:
    """(board, scope, minutes after T0) of each stored snapshot."""
    async with db.connect() as conn:
        rows = await conn.execute(
            select(snapshots.c.board_id, snapshots.c.scope, snapshots.c.taken_at)
        )
        return sorted(
            (board, scope, round((at - T0.replace(tzinfo=None)).total_seconds() / 60))
            for board, scope, at in rows
        )


async def test_snapshots_past_the_retention_go_with_their_users(
    db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_retention, "DELETE_CHUNK", 3)  # a view's in several statements
    day = 24 * 60
    # Board main's global view every 8 hours over 30 days, its teams' view and board cup's once.
    rows = [shot(n * 8 * 60, ["old", "new"] if n < 60 else ["new"]) for n in range(90)]
    rows += [shot(0, ["a"], scope="region:eu"), shot(29 * day, ["a"], board_id="cup")]
    await save_snapshots(db, rows)
    before = EXPIRED._value.get()

    assert await expire(db, 10, now=NOW) == 61  # taken before day 20: 60 and main's region:eu

    left = await kept(db)
    assert left == sorted(
        [("main", "global", n * 8 * 60) for n in range(60, 90)] + [("cup", "global", 29 * day)]
    )
    assert EXPIRED._value.get() - before == 61
    async with db.connect() as conn:
        users = {row.user_id for row in await conn.execute(select(snapshot_users.c.user_id))}
    assert users == {"new", "a"}
    # The read at a time before the cut-off finds nothing now; after it, what it found before.
    assert await snapshot_at(db, "main", "global", "alltime", T0 + timedelta(days=19)) is None
    at = T0 + timedelta(days=20, hours=1)
    shot_at = await snapshot_at(db, "main", "global", "alltime", at)
    assert shot_at is not None and shot_at["taken_at"] == rfc3339(T0 + timedelta(days=20))
    # A second sweep has nothing to do.
    assert await expire(db, 10, now=NOW) == 0


async def test_a_retention_of_0_keeps_every_snapshot(db: AsyncEngine) -> None:
    await save_snapshots(db, [shot(0, ["a"])])
    stop = asyncio.Event()
    task = asyncio.create_task(until_stopped(db, 0, stop, interval=0.01))
    await asyncio.sleep(0.1)  # ten intervals
    assert len(await kept(db)) == 1
    assert not task.done(), "a companion of the service runs until it is stopped"
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_the_history_service_sweeps_every_interval_until_stopped(db: AsyncEngine) -> None:
    await save_snapshots(db, [shot(0, ["a"])])  # T0, long before the retention of a day
    stop = asyncio.Event()
    task = asyncio.create_task(until_stopped(db, 1, stop, interval=0.05))

    async def swept() -> bool:
        return await kept(db) == []

    await eventually(swept)
    await save_snapshots(db, [shot(1, ["b"])])
    await eventually(swept)  # and again an interval later
    stop.set()
    await asyncio.wait_for(task, 1)


def test_the_retention_is_0_days_to_a_hundred_years(settings: LadderSettings) -> None:
    assert settings.snapshot_retention_days == 0
    for wrong in (-1, 36_501):
        with pytest.raises(ValidationError):
            settings.model_validate({**settings.model_dump(), "snapshot_retention_days": wrong})
