"""What an erasure's MySQL statements cost (docs/api.md section 8b): each finds the user's rows by
an index, whatever the size of the table, and none scans a table whole, which on an event log
of a million rows took a second a statement and locked every row it passed. The plans are read
with EXPLAIN (tests/plans.py); the rows left are counted after."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, insert, select

from services.api.eraser import Eraser
from services.history.handlers import HistoryHandler
from shared.boards import Board, BoardCatalog
from shared.db import friend_requests, friendships, hidden_users, open_engine, score_events
from shared.erasure import finish_board_deletion, record_board_deletion
from shared.friendships import ask, befriend
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import accepted_event
from tests.plans import analyze, plans, recorded

USERS = 100
# The event log's indexes that lead to a user board by board (the unique key with epoch 0).
BY_BOARD_AND_USER = (
    "ix_score_events_board_id_user_id_accepted_at_id",
    "uq_score_events_board_id_board_epoch_user_id_event_id",
)


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def test_an_erasure_finds_the_users_events_board_by_board_on_every_epoch(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The user's events go from the live boards, from a board deleted without purge (its rows
    kept under the deletion's epoch) and from the fresh board of that name; nobody else's."""
    catalog = BoardCatalog(redis, keys)
    boards = ("main", "arena", "gone")
    async with open_engine(quiet.mysql_url) as engine:
        store = HistoryHandler(engine)
        await store(
            [
                accepted_event(f"e-{n}", board_id=board, user_id=f"u-{n % USERS}")
                for board in boards
                for n in range(3 * USERS)
            ]
        )
        await store(
            [accepted_event(f"x-{board}", board_id=board, user_id="u-x") for board in boards]
        )
        async with engine.begin() as conn:
            deletion = await record_board_deletion(conn, "gone", purge=False)
        await finish_board_deletion(engine, deletion)
        fresh = deletion.cutoff + timedelta(seconds=1)
        await store([accepted_event("x-fresh", board_id="gone", user_id="u-x", accepted_at=fresh)])
        for board in ("main", "arena", "gone"):
            await catalog.put(Board(board_id=board))
        await analyze(engine, "score_events")
        t = score_events.c
        async with engine.connect() as conn:
            mine = select(t.board_id, t.board_epoch > 0).where(t.user_id == "u-x")
            held = sorted(tuple(row) for row in await conn.execute(mine))
        assert held == [("arena", False), ("gone", False), ("gone", True), ("main", False)]

        eraser = Eraser(engine, redis, keys, catalog, 0)
        with recorded(engine, "score_events") as statements:
            for _ in range(2):  # both passes
                await eraser.erase_user("u-x", datetime.now(UTC) + timedelta(minutes=1))

        async with engine.connect() as conn:
            users = select(t.user_id, func.count()).group_by(t.user_id)
            left = {user: n for user, n in await conn.execute(users)}
        found = await plans(engine, "score_events", statements)

    assert "u-x" not in left
    assert left == {f"u-{n}": 3 * 3 for n in range(USERS)}

    assert len(found) == len(statements) > 0
    for (statement, _), plan in zip(statements, found, strict=True):
        assert plan["type"] != "ALL", (statement, plan)
        if "user_id" in statement:  # a range a board of an index on board and user
            assert plan["key"] in BY_BOARD_AND_USER and int(plan["rows"]) < 20, (statement, plan)


async def test_an_erasure_finds_the_users_friendships_and_hides_by_their_keys(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """Friendships both ways, from the user's own rows (each has its mirror), its requests, and
    its hides on every board, one no longer defined (being deleted) included; nobody else's.
    (Requests are indexed both ways: on the table's few rows here MySQL scans it all the same.)"""
    catalog = BoardCatalog(redis, keys)
    for board in ("main", "arena"):
        await catalog.put(Board(board_id=board))
    now = datetime.now(UTC)
    pairs = [(f"u-{n}", f"u-{(n + step) % USERS}") for n in range(USERS) for step in (1, 2)]
    async with open_engine(quiet.mysql_url) as engine:
        async with engine.begin() as conn:
            await conn.execute(
                insert(friendships),
                [
                    {"user_id": a, "friend_id": b, "created_at": now}
                    for p in pairs
                    for a, b in (p, p[::-1])
                ],
            )
            await conn.execute(
                insert(hidden_users),
                [
                    {"board_id": board, "user_id": f"u-{n}", "hidden_at": now}
                    for board in ("main", "arena")
                    for n in range(USERS)
                ]
                + [{"board_id": b, "user_id": "u-x", "hidden_at": now} for b in ("main", "gone")],
            )
        for friend in ("u-1", "u-2", "u-3"):
            await befriend(engine, "u-x", friend)
        await ask(engine, "u-x", "u-4")
        await ask(engine, "u-5", "u-x")
        await analyze(engine, "friendships", "friend_requests", "hidden_users")

        eraser = Eraser(engine, redis, keys, catalog, 0)
        with (
            recorded(engine, "friendships") as by_friends,
            recorded(engine, "hidden_users") as by_hides,
        ):
            for _ in range(2):  # both passes
                await eraser.erase_user("u-x", now + timedelta(minutes=1))

        f, h = friendships.c, hidden_users.c
        async with engine.connect() as conn:
            friends = [tuple(row) for row in await conn.execute(select(f.user_id, f.friend_id))]
            requests = (await conn.execute(select(friend_requests))).all()
            hides = [tuple(row) for row in await conn.execute(select(h.board_id, h.user_id))]
        found = [
            (statement, plan)
            for table, seen in (("friendships", by_friends), ("hidden_users", by_hides))
            for statement, plan in zip(seen, await plans(engine, table, seen), strict=True)
        ]

    assert sorted(friends) == sorted(p for pair in pairs for p in (pair, pair[::-1]))
    assert requests == []
    assert sorted(hides) == sorted((b, f"u-{n}") for b in ("main", "arena") for n in range(USERS))
    assert by_friends and by_hides
    for statement, plan in found:
        assert plan["type"] != "ALL", (statement, plan)
