"""Who each stored snapshot holds (``snapshot_users``, shared/db.py): written with the snapshot,
read by an erasure to find the user's snapshots by key rather than by reading every snapshot
ever stored (services/api/erased_rows.py), and gone with the snapshots a purge deletes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.api import erased_rows
from services.api.erased_rows import erase_from_snapshots, purge_board
from shared import db_boards
from shared.db import snapshot_users, snapshots
from shared.db_boards import SnapshotRow, save_snapshots
from shared.erasure import BoardDeletion
from tests.helpers import T0


def shot(n: int, users: list[str], board_id: str = "main", scope: str = "global") -> SnapshotRow:
    entries: list[dict[str, Any]] = [
        {"rank": rank, "user_id": user, "score": 100 - rank} for rank, user in enumerate(users, 1)
    ]
    return {
        "board_id": board_id,
        "scope": scope,
        "period": "alltime",
        "period_id": "all",
        "taken_at": T0 + timedelta(minutes=n),
        "entries": entries,
    }


async def indexed(db: AsyncEngine) -> set[tuple[str, int]]:
    async with db.connect() as conn:
        rows = await conn.execute(select(snapshot_users.c.user_id, snapshot_users.c.snapshot_id))
        return {(row.user_id, row.snapshot_id) for row in rows}


async def stored(db: AsyncEngine) -> dict[int, list[str]]:
    async with db.connect() as conn:
        rows = await conn.execute(select(snapshots.c.id, snapshots.c.entries))
        return {
            row.id: [e.get("user_id", e.get("team_id")) for e in orjson.loads(row.entries)]
            for row in rows
        }


async def test_a_snapshot_s_users_are_kept_beside_it_once(
    db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_boards, "USERS_CHUNK", 3)  # the rows in two statements
    teams = shot(0, [], scope="teams")
    teams["entries"] = [{"rank": 1, "team_id": "red", "score": 9}]
    await save_snapshots(db, [shot(0, ["a", "b"]), shot(1, ["b", "c"]), teams])
    # A pass that lost its lease stores the same take again: no row twice.
    await save_snapshots(db, [shot(1, ["b", "c"])])

    ids = {users[0]: sid for sid, users in (await stored(db)).items()}
    assert await indexed(db) == {
        ("a", ids["a"]),
        ("b", ids["a"]),
        ("b", ids["b"]),
        ("c", ids["b"]),
    }


async def test_an_erasure_rewrites_the_user_s_snapshots_a_page_at_a_time(
    db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(erased_rows, "SNAPSHOT_PAGE", 2)
    rows = [shot(n, ["gone", "kept"] if n % 2 else ["kept", "other"]) for n in range(7)]
    await save_snapshots(db, rows)
    before = await stored(db)

    await erase_from_snapshots(db, "gone")

    after = await stored(db)
    assert after == {sid: [u for u in users if u != "gone"] for sid, users in before.items()}, (
        "every snapshot that held the user, and only the user's entries"
    )
    assert {user for user, _ in await indexed(db)} == {"kept", "other"}
    # Done already: a repeated erasure finds nothing to do.
    await erase_from_snapshots(db, "gone")
    assert await stored(db) == after


async def test_a_user_s_snapshots_are_found_by_key(db: AsyncEngine) -> None:
    await save_snapshots(db, [shot(n, [f"u-{n}", "kept"]) for n in range(20)])
    async with db.connect() as conn:
        plan = (
            await conn.execute(
                text(
                    "EXPLAIN SELECT snapshot_id FROM snapshot_users WHERE user_id = 'u-3' "
                    "ORDER BY snapshot_id LIMIT 200"
                )
            )
        ).one()
    assert plan.key == "PRIMARY" and plan.type == "ref", plan


async def test_a_purge_takes_its_snapshots_users_with_them(db: AsyncEngine) -> None:
    await save_snapshots(db, [shot(0, ["a", "b"]), shot(1, ["a"], board_id="cup")])
    cutoff = T0 + timedelta(hours=1)

    await purge_board(db, BoardDeletion("main", cutoff, True, None))

    assert list((await stored(db)).values()) == [["a"]]
    assert {user for user, _ in await indexed(db)} == {"a"}
    assert len(await indexed(db)) == 1
