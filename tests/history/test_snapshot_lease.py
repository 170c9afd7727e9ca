"""Several history processes (the cluster rehearsal runs two): one at a time takes a board's
snapshots, under the board's snapshot lease, so no view is stored twice from one mark and no pass
deletes the marks another has taken."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from datetime import UTC, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history import snapshotter as snapshotter_module
from services.history.snapshotter import Snapshotter, view_member
from shared.boards import MAIN_BOARD, Board
from shared.db import snapshots
from shared.keys import Keys
from tests.history.test_snapshots import T1, write_view

EU = view_member("alltime", "all", "region:eu")
US = view_member("alltime", "all", "region:us")


class HeldSaves:
    """``save_snapshots`` of the snapshotter, each call held at a gate while gates are handed
    out (one a call, in order), as a pass whose MySQL insert is slow."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gates: list[asyncio.Event] = []
        self._arrived: asyncio.Queue[None] = asyncio.Queue()
        real = snapshotter_module.save_snapshots

        async def held(engine: AsyncEngine, rows: list[snapshotter_module.SnapshotRow]) -> int:
            if self.gates:
                gate = self.gates.pop(0)
                self._arrived.put_nowait(None)
                await gate.wait()
            return await real(engine, rows)

        monkeypatch.setattr(snapshotter_module, "save_snapshots", held)

    def hold(self) -> asyncio.Event:
        gate = asyncio.Event()
        self.gates.append(gate)
        return gate

    async def parked(self, task: Awaitable[int]) -> bool:
        """Whether ``task`` stopped at a held save (``True``) or finished without one."""
        arrived = asyncio.ensure_future(self._arrived.get())
        done, _ = await asyncio.wait(
            {asyncio.ensure_future(task), arrived},
            timeout=10,
            return_when=asyncio.FIRST_COMPLETED,
        )
        assert done, "the pass neither finished nor reached a save"
        if arrived in done:
            return True
        arrived.cancel()
        return False


async def rows_of(db: AsyncEngine, scope: str) -> int:
    async with db.connect() as conn:
        counted = await conn.execute(
            select(func.count())
            .select_from(snapshots)
            .where(snapshots.c.board_id == "main", snapshots.c.scope == scope)
        )
        return int(counted.scalar_one())


async def stop(task: asyncio.Task[int]) -> None:
    """A history process that dies mid-pass."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def views(redis: Redis, keys: Keys) -> None:
    for region in ("eu", "us"):
        await write_view(redis, keys, MAIN_BOARD, "alltime", "all", f"region:{region}", {"u-1": 5})


@pytest.mark.usefixtures("views")
async def test_two_processes_take_each_snapshot_once_and_lose_no_mark(
    redis: Redis, keys: Keys, db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = Snapshotter(redis, keys, db, size=3), Snapshotter(redis, keys, db, size=3)
    saves = HeldSaves(monkeypatch)
    dirty, taking = keys.snapshot_dirty("main"), keys.snapshot_dirty("main", taking=True)
    await redis.sadd(dirty, EU)
    first_gate = saves.hold()
    first = asyncio.create_task(one.take_board(MAIN_BOARD, T1))
    assert await saves.parked(first)  # the first process's pass, mid-way

    # The second process's passes meanwhile: the board is the first's.
    assert await two.take_board(MAIN_BOARD, T1 + timedelta(seconds=1)) == 0
    await redis.sadd(dirty, US)  # a view changes during the first pass
    saves.hold()
    second = asyncio.create_task(two.take_board(MAIN_BOARD, T1 + timedelta(seconds=2)))
    await saves.parked(second)
    saves.gates.clear()

    first_gate.set()
    assert await first == 1
    if not second.done():
        await stop(second)
    # The mark made during the first pass is taken by the next one, whoever makes it.
    assert await two.take_board(MAIN_BOARD, T1 + timedelta(seconds=3)) == 1
    assert await rows_of(db, "region:eu") == 1
    assert await rows_of(db, "region:us") == 1
    assert not await redis.exists(dirty, taking, keys.lease("main", "snap"))


@pytest.mark.usefixtures("views")
async def test_a_pass_that_lost_its_lease_deletes_no_marks_taken_since(
    redis: Redis, keys: Keys, db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = Snapshotter(redis, keys, db, size=3), Snapshotter(redis, keys, db, size=3)
    saves = HeldSaves(monkeypatch)
    dirty, taking = keys.snapshot_dirty("main"), keys.snapshot_dirty("main", taking=True)
    lease = keys.lease("main", "snap")
    await redis.sadd(dirty, EU)
    first_gate = saves.hold()
    first = asyncio.create_task(one.take_board(MAIN_BOARD, T1))
    assert await saves.parked(first)
    await redis.delete(lease)  # the first pass is paused past its lease

    # The second process takes the board over: the set left to take, then a newer mark.
    assert await two.take_board(MAIN_BOARD, T1 + timedelta(seconds=1)) == 1
    await redis.sadd(dirty, US)
    saves.hold()
    second = asyncio.create_task(two.take_board(MAIN_BOARD, T1 + timedelta(seconds=2)))
    assert await saves.parked(second)
    assert await redis.smembers(taking) == {US}

    # The first pass resumes and ends: the second's set is not its to delete. (Its snapshot of
    # eu, the one the second process stored from the same take, is not stored again.)
    first_gate.set()
    assert await first == 0
    assert await rows_of(db, "region:eu") == 1
    assert await redis.smembers(taking) == {US}
    await stop(second)
    await redis.delete(lease)  # the second process died: its lease lapses
    assert await one.take_board(MAIN_BOARD, T1 + timedelta(seconds=3)) == 1
    assert await rows_of(db, "region:us") == 1
    assert not await redis.exists(dirty, taking, lease)


class OneBoard:
    """The catalog of board main alone, as the ticker asks for boards."""

    async def all(self) -> list[Board]:
        return [MAIN_BOARD]


@pytest.mark.usefixtures("views")
async def test_a_stopped_process_gives_up_the_lease_of_a_pass_that_failed(
    redis: Redis, keys: Keys, db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = Snapshotter(redis, keys, db, size=3), Snapshotter(redis, keys, db, size=3)
    await redis.sadd(keys.snapshot_dirty("main"), EU)

    async def unreachable(engine: AsyncEngine, rows: list[Any]) -> int:
        raise ConnectionError("MySQL is away")

    monkeypatch.setattr(snapshotter_module, "save_snapshots", unreachable)
    stop_now = asyncio.Event()
    stop_now.set()  # the last pass, on the way out: it fails, holding the board's lease
    await snapshotter_module.tick(one, OneBoard(), 0.05, stop_now)  # type: ignore[arg-type]
    monkeypatch.undo()
    # Given up on the way out: another process takes the set over at once, not 60 s later.
    assert not await redis.exists(keys.lease("main", "snap"))
    assert await two.take_board(MAIN_BOARD, T1 + timedelta(seconds=1)) == 1
    assert await rows_of(db, "region:eu") == 1


@pytest.mark.usefixtures("views")
async def test_a_pass_that_lost_its_lease_mid_way_stores_no_snapshot_twice(
    redis: Redis, keys: Keys, db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is renewed before each chunk of views, not in the MySQL write: a pass paused
    after its check (here, at its second chunk's save) stores that chunk after its successor
    has taken the same set again and stored every view of it."""
    monkeypatch.setattr(snapshotter_module, "CHUNK", 1)  # eu, then us, a chunk each
    one, two = Snapshotter(redis, keys, db, size=3), Snapshotter(redis, keys, db, size=3)
    saves = HeldSaves(monkeypatch)
    await redis.sadd(keys.snapshot_dirty("main"), EU, US)
    saves.hold().set()  # eu's save goes through
    us_gate = saves.hold()
    first = asyncio.create_task(one.take_board(MAIN_BOARD, T1))
    assert await saves.parked(first)  # eu stored
    assert await saves.parked(first)  # us read, its lease checked, its save held
    await redis.delete(keys.lease("main", "snap"))  # paused past its lease

    # The second process takes the set left over, under the time it was taken at: eu is stored
    # already, us is stored now.
    assert await two.take_board(MAIN_BOARD, T1 + timedelta(seconds=70)) == 1
    # The first pass resumes: of its two, eu was stored by itself, us by the second.
    us_gate.set()
    assert await first == 1
    assert await rows_of(db, "region:eu") == 1
    assert await rows_of(db, "region:us") == 1
    async with db.connect() as conn:
        times = await conn.execute(select(snapshots.c.taken_at).distinct())
        assert [t.replace(tzinfo=UTC) for t in times.scalars()] == [T1]
