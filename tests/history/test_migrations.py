"""The history schema's migrations against real MariaDB: the tables of shared/db.py are exactly
what the migrations make (what ``alembic revision --autogenerate`` compares), and a database
holding events at an older revision upgrades in place, keeping them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from services.history.handlers import COLUMNS, HistoryHandler, _row
from services.history.migrate import alembic_config, check_schema, migrate
from shared.db import count_events, metadata, open_engine, user_events
from shared.db_boards import SnapshotRow, save_snapshots
from shared.events import ScoreAccepted
from shared.settings import LadderSettings
from tests.conftest import MYSQL_SERVER_URL
from tests.helpers import T0, accepted_event, server_statement
from tests.history.test_history import scratch_database
from tests.stack import ROOT, run


@pytest.fixture
async def mysql_database(settings: LadderSettings, test_id: str) -> AsyncIterator[str]:
    """Here the test's database is migrated to head by the migrations themselves, not copied
    from a migrated template as elsewhere: what these tests check is what they make."""
    await migrate(settings.mysql_url)
    yield f"ladder_{test_id}"
    await server_statement(MYSQL_SERVER_URL, f"DROP DATABASE IF EXISTS `ladder_{test_id}`")


def _differences(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(
        connection, opts={"compare_type": True, "compare_server_default": True}
    )
    return list(compare_metadata(context, metadata))


async def test_the_tables_are_what_the_migrations_make(db: AsyncEngine) -> None:
    """Compared as the migration environment compares them (types and server defaults too):
    a column added to shared/db.py without its migration, or the other way round, fails here."""
    async with db.connect() as conn:
        assert await conn.run_sync(_differences) == []


def _alembic(connection: Connection, verb: str, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    getattr(command, verb)(config, revision)


async def alembic_to(url: str, verb: str, revision: str) -> None:
    """``alembic upgrade`` or ``downgrade`` to ``revision``, on the connection env.py is handed,
    as :func:`services.history.migrate.migrate` runs it."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_alembic, verb, revision)
            await conn.commit()
    finally:
        await engine.dispose()


def _columns(connection: Connection) -> list[str]:
    return [c["name"] for c in inspect(connection).get_columns("score_events")]


# Two events as the history service stored them before 0003, in the columns it had.
OLD_ROWS = [
    {"event_id": f"e-{i}", "value": v, "at": T0 + timedelta(seconds=i)}
    for i, v in enumerate((5, -9007199254740991))
]


async def test_a_database_at_0002_with_events_upgrades_keeping_them(
    settings: LadderSettings,
) -> None:
    async with scratch_database(settings, "up") as url:
        base, _, name = url.rpartition("/")
        await server_statement(base, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        await alembic_to(url, "upgrade", "0002")
        async with open_engine(url, changed_rows=True) as engine:
            async with engine.begin() as conn:
                assert "metadata" not in await conn.run_sync(_columns)
                await conn.execute(
                    text(
                        "INSERT INTO score_events (event_id, board_id, user_id, region, team_id,"
                        " display_name, value, occurred_at, accepted_at) VALUES (:event_id,"
                        " 'main', 'u-1', 'eu', NULL, 'Ana', :value, :at, :at)"
                    ),
                    [{**row, "at": row["at"].replace(tzinfo=None)} for row in OLD_ROWS],
                )

            await migrate(url)

            await check_schema(engine)
            async with engine.connect() as conn:
                assert await conn.run_sync(_differences) == []
                assert (await conn.execute(text("SELECT COUNT(*) FROM score_events"))).scalar() == 2
            # The old events read with no subscore and no metadata; a new one keeps both.
            await HistoryHandler(engine)(
                [
                    accepted_event("e-new", accepted_at=T0 + timedelta(minutes=1)).model_copy(
                        update={"subscore": 3, "metadata": {"k": "v"}}
                    )
                ]
            )
            events, _ = await user_events(engine, "main", "u-1", 10, None)
    assert [(e["event_id"], e["value"], e["subscore"], e["metadata"]) for e in events] == [
        ("e-new", 5, 3, {"k": "v"}),
        ("e-1", -9007199254740991, None, None),
        ("e-0", 5, None, None),
    ]


async def test_0003_downgrades_to_0002_keeping_the_events(db: AsyncEngine) -> None:
    """The way back, for an operator who returns to the release before: the two columns go,
    every event stays."""
    await HistoryHandler(db)([accepted_event("e-1").model_copy(update={"metadata": {"k": 1}})])
    url = db.url.render_as_string(hide_password=False)

    await alembic_to(url, "downgrade", "0002")

    async with db.connect() as conn:
        columns = await conn.run_sync(_columns)
        count = (await conn.execute(text("SELECT COUNT(*) FROM score_events"))).scalar()
    assert "subscore" not in columns and "metadata" not in columns
    assert count == 1
    # And up again, as `make migrate` would.
    await migrate(url)
    await check_schema(db)


def _tables(connection: Connection) -> list[str]:
    return sorted(inspect(connection).get_table_names())


async def test_friend_requests_downgrade_and_upgrade_keeping_the_friendships(
    db: AsyncEngine,
) -> None:
    """0005 (friend_requests) one step down and up again: pending requests go with their table,
    friendships stay, and the table comes back empty and as shared/db.py defines it."""
    url = db.url.render_as_string(hide_password=False)
    async with db.begin() as conn:
        await conn.execute(
            text("INSERT INTO friendships VALUES ('u-1', 'u-2', NOW(6)), ('u-2', 'u-1', NOW(6))")
        )
        await conn.execute(text("INSERT INTO friend_requests VALUES ('u-3', 'u-1', NOW(6))"))

    # Down to 0005's parent: the steps after 0005 (0006, 0007) go first.
    await alembic_to(url, "downgrade", "0004")

    async with db.connect() as conn:
        tables = await conn.run_sync(_tables)
        kept = (await conn.execute(text("SELECT COUNT(*) FROM friendships"))).scalar()
        revision = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    assert "friend_requests" not in tables and "friendships" in tables
    assert kept == 2
    assert revision != "0005"

    await migrate(url)

    await check_schema(db)
    async with db.connect() as conn:
        assert await conn.run_sync(_differences) == []
        pending = (await conn.execute(text("SELECT COUNT(*) FROM friend_requests"))).scalar()
        kept = (await conn.execute(text("SELECT COUNT(*) FROM friendships"))).scalar()
    assert (pending, kept) == (0, 2)


async def store_before(conn: AsyncConnection, column: str, events: list[ScoreAccepted]) -> None:
    """Events as the history service stored them before ``column`` was added: the columns
    of COLUMNS before it."""
    columns = COLUMNS[: COLUMNS.index(column)]
    statement = (
        f"INSERT INTO score_events ({', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    await conn.exec_driver_sql(statement, [_row(e, 0)[: len(columns)] for e in events])


async def store_before_0008(engine: AsyncEngine, events: list[ScoreAccepted]) -> None:
    """Events as the history service stored them between 0003 and 0008: no board_epoch."""
    async with engine.begin() as conn:
        await store_before(conn, "board_epoch", events)


def _unique_keys(connection: Connection) -> list[list[str]]:
    return [c["column_names"] for c in inspect(connection).get_unique_constraints("score_events")]


async def test_0004_makes_an_event_id_per_user_in_place_and_back_while_ids_are_not_shared(
    settings: LadderSettings,
) -> None:
    """0003 to 0004 keeps every event and makes an event id unique per board and user: another
    user's event of a stored id is stored, a redelivery of either is not. The way back refuses,
    changing nothing, while two users' events of a board share an id (the old key would refuse
    them); once they do not, it restores the old key."""
    async with scratch_database(settings, "ids") as url:
        base, _, name = url.rpartition("/")
        await server_statement(base, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        await alembic_to(url, "upgrade", "0003")
        async with open_engine(url, changed_rows=True) as engine:
            await store_before_0008(engine, [accepted_event("e-1"), accepted_event("e-2")])
            async with engine.connect() as conn:
                assert await conn.run_sync(_unique_keys) == [["board_id", "event_id"]]

            await migrate(url)

            await check_schema(engine)
            async with engine.connect() as conn:
                assert await conn.run_sync(_differences) == []
                assert await conn.run_sync(_unique_keys) == [
                    ["board_id", "board_epoch", "user_id", "event_id"]
                ]
            later = T0 + timedelta(minutes=1)
            shared = accepted_event("e-1", user_id="u-2", value=9, accepted_at=later)
            await HistoryHandler(engine)([shared, accepted_event("e-1"), shared])
            assert await count_events(engine, "main") == 3
            assert await count_events(engine, "main", "e-1", "u-2") == 1
            events, _ = await user_events(engine, "main", "u-2", 10, None)
            assert [(e["event_id"], e["value"]) for e in events] == [("e-1", 9)]

            # The steps after 0004 go back first; 0004's own step then refuses.
            await alembic_to(url, "downgrade", "0004")
            with pytest.raises(RuntimeError, match=r"share an event id .*main/e-1 \(2 users\)"):
                await alembic_to(url, "downgrade", "0003")
            async with engine.connect() as conn:
                assert await conn.run_sync(_unique_keys) == [["board_id", "user_id", "event_id"]]
                revision = await conn.execute(text("SELECT version_num FROM alembic_version"))
                assert revision.scalar() == "0004"
            assert await count_events(engine, "main") == 3

            async with engine.begin() as conn:
                await conn.execute(text("DELETE FROM score_events WHERE user_id = 'u-2'"))
            await alembic_to(url, "downgrade", "0003")
            async with engine.connect() as conn:
                assert await conn.run_sync(_unique_keys) == [["board_id", "event_id"]]
                assert (await conn.execute(text("SELECT COUNT(*) FROM score_events"))).scalar() == 2
            # And up again, as `make migrate` would.
            await migrate(url)
            await check_schema(engine)


async def test_0008_sets_a_deleted_board_s_events_apart_and_back_while_ids_are_not_shared(
    settings: LadderSettings,
) -> None:
    """0007 to 0008: the events a deleted board kept take the deletion's cut-off as their epoch,
    so that the board made after it may store an event of a kept id (the old key took it for a
    redelivery). The way back refuses while such ids are shared, changing nothing."""
    async with scratch_database(settings, "epoch") as url:
        base, _, name = url.rpartition("/")
        await server_statement(base, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        await alembic_to(url, "upgrade", "0007")
        async with open_engine(url, changed_rows=True) as engine:
            await store_before_0008(engine, [accepted_event("e-1"), accepted_event("e-2")])
            async with engine.begin() as conn:  # main deleted (no purge) after both
                await conn.execute(
                    text(
                        "INSERT INTO board_deletions VALUES "
                        "('main', '2026-11-29 18:00:00.000000', 0, '2026-11-29 18:00:07.000000')"
                    )
                )
            await migrate(url)
            await check_schema(engine)
            async with engine.connect() as conn:
                assert await conn.run_sync(_differences) == []
                epochs = await conn.execute(text("SELECT DISTINCT board_epoch FROM score_events"))
                assert epochs.scalars().all() == [1_795_975_200_000]  # the cut-off in ms
            later = T0 + timedelta(days=2)
            await HistoryHandler(engine)([accepted_event("e-1", value=9, accepted_at=later)])
            assert await count_events(engine, "main") == 3

            with pytest.raises(RuntimeError, match=r"share event ids .*main/u-1/e-1"):
                await alembic_to(url, "downgrade", "0007")
            async with engine.begin() as conn:
                await conn.execute(text("DELETE FROM score_events WHERE board_epoch = 0"))
            await alembic_to(url, "downgrade", "0007")
            async with engine.connect() as conn:
                assert await conn.run_sync(_unique_keys) == [["board_id", "user_id", "event_id"]]
                assert (await conn.execute(text("SELECT COUNT(*) FROM score_events"))).scalar() == 2


def _snapshot_keys(connection: Connection) -> list[list[str]]:
    return [c["column_names"] for c in inspect(connection).get_unique_constraints("snapshots")]


async def store_snapshot(
    conn: AsyncConnection,
    entries: str,
    period_id: str = "all",
    scope: str = "global",
    at: datetime = T0,  # 2026-11-29 17:00:00 UTC
) -> None:
    """A snapshot of board main's all-time ``scope`` stored as a release before stored it."""
    statement = (
        "INSERT INTO snapshots (board_id, scope, period, period_id, taken_at, entries) VALUES "
        "('main', :scope, 'alltime', :period_id, :at, :entries)"
    )
    values = {"scope": scope, "period_id": period_id, "at": at.replace(tzinfo=None)}
    await conn.execute(text(statement), {**values, "entries": entries})


async def test_0009_keeps_one_snapshot_of_a_view_a_time_and_goes_back(db: AsyncEngine) -> None:
    """0008 to 0009: rows of one view under one time (a snapshot stored twice) are cut to the one
    a read answers, the highest id, and the key then stores a view's snapshot of a take once;
    the way back drops the key, keeping every row."""
    url = db.url.render_as_string(hide_password=False)
    await alembic_to(url, "downgrade", "0008")
    async with db.begin() as conn:
        for entries in ("[1]", "[2]", "[3]"):
            await store_snapshot(conn, entries)
        await store_snapshot(conn, "[4]", period_id="other")

    await migrate(url)

    await check_schema(db)
    async with db.connect() as conn:
        assert await conn.run_sync(_differences) == []
        assert await conn.run_sync(_snapshot_keys) == [
            ["board_id", "scope", "period", "period_id", "taken_at"]
        ]
        kept = await conn.execute(text("SELECT entries FROM snapshots ORDER BY id"))
        assert kept.scalars().all() == ["[3]", "[4]"]
    row: SnapshotRow = {
        "board_id": "main",
        "scope": "global",
        "period": "alltime",
        "period_id": "all",
        "taken_at": T0,  # 2026-11-29 17:00:00 UTC
        "entries": [],
    }
    assert await save_snapshots(db, [row]) == 0  # stored already under that time

    await alembic_to(url, "downgrade", "0008")
    async with db.connect() as conn:
        assert await conn.run_sync(_snapshot_keys) == []
        assert (await conn.execute(text("SELECT COUNT(*) FROM snapshots"))).scalar() == 2
    await migrate(url)
    await check_schema(db)


async def test_0010_keeps_each_event_s_periods_and_goes_back_keeping_the_events(
    db: AsyncEngine,
) -> None:
    """An event stored at 0009 reads NULL periods after the upgrade (the rebuild then works them
    out from the board's definition); one stored after keeps them; the way back drops the
    column, every event stays."""
    url = db.url.render_as_string(hide_password=False)
    await alembic_to(url, "downgrade", "0009")
    async with db.begin() as conn:
        assert "periods" not in await conn.run_sync(_columns)
        await store_before(conn, "periods", [accepted_event("e-old")])

    await migrate(url)
    await check_schema(db)
    await HistoryHandler(db)([accepted_event("e-new", accepted_at=T0 + timedelta(seconds=5))])
    async with db.connect() as conn:
        rows = await conn.execute(text("SELECT event_id, periods FROM score_events ORDER BY id"))
        assert [tuple(row) for row in rows] == [("e-old", None), ("e-new", "alltime=all")]

    await alembic_to(url, "downgrade", "0009")
    async with db.connect() as conn:
        assert "periods" not in await conn.run_sync(_columns)
        assert (await conn.execute(text("SELECT COUNT(*) FROM score_events"))).scalar() == 2
    await migrate(url)
    await check_schema(db)


async def test_0011_adds_the_previous_cut_off_and_goes_back(db: AsyncEngine) -> None:
    """The way back drops board_deletions.previous_cutoff; the way up makes the schema whole."""
    url = db.url.render_as_string(hide_password=False)
    await alembic_to(url, "downgrade", "0010")
    async with db.connect() as conn:
        found = await conn.run_sync(lambda c: inspect(c).get_columns("board_deletions"))
        assert "previous_cutoff" not in [column["name"] for column in found]
    await migrate(url)
    await check_schema(db)


def _indexes(connection: Connection) -> list[list[str | None]]:
    return [i["column_names"] for i in inspect(connection).get_indexes("score_events")]


async def test_0012_keeps_each_event_s_outbox_position_and_goes_back_keeping_the_events(
    db: AsyncEngine,
) -> None:
    """An event stored at 0011 reads NULL positions after the upgrade (the rebuild replays such
    events first, in id order); one stored after keeps its position, and the index the rebuild
    pages by is there; the way back drops both columns and the index, every event stays."""
    url = db.url.render_as_string(hide_password=False)
    order = ["board_id", "outbox_ms", "outbox_seq", "id"]
    await alembic_to(url, "downgrade", "0011")
    async with db.begin() as conn:
        assert "outbox_ms" not in await conn.run_sync(_columns)
        await store_before(conn, "outbox_ms", [accepted_event("e-old")])

    await migrate(url)
    await check_schema(db)
    positioned = accepted_event("e-new", accepted_at=T0 + timedelta(seconds=5))
    await HistoryHandler(db)([positioned.model_copy(update={"outbox_id": "1764435600123-4"})])
    async with db.connect() as conn:
        assert order in await conn.run_sync(_indexes)
        rows = await conn.execute(
            text("SELECT event_id, outbox_ms, outbox_seq FROM score_events ORDER BY id")
        )
        assert [tuple(row) for row in rows] == [
            ("e-old", None, None),
            ("e-new", 1764435600123, 4),
        ]

    await alembic_to(url, "downgrade", "0011")
    async with db.connect() as conn:
        columns = await conn.run_sync(_columns)
        assert "outbox_ms" not in columns and "outbox_seq" not in columns
        assert order not in await conn.run_sync(_indexes)
        assert (await conn.execute(text("SELECT COUNT(*) FROM score_events"))).scalar() == 2
    await migrate(url)
    await check_schema(db)


def _tables(connection: Connection) -> list[str]:
    return list(inspect(connection).get_table_names())


async def test_0013_lists_the_users_of_the_snapshots_stored_before_and_goes_back(
    db: AsyncEngine,
) -> None:
    """Snapshots stored at 0012 (more than the migration reads a statement) get a row for each
    user they hold, so that an erasure finds them; entries without a user (a team's) get none.
    The way back drops the table, every snapshot stays."""
    url = db.url.render_as_string(hide_password=False)
    await alembic_to(url, "downgrade", "0012")
    async with db.begin() as conn:
        assert "snapshot_users" not in await conn.run_sync(_tables)
        for n in range(1201):
            users = [{"rank": 1, "user_id": f"u-{n}"}, {"rank": 2, "user_id": "kept"}]
            await store_snapshot(conn, json.dumps(users), at=T0 + timedelta(seconds=n))
        await store_snapshot(conn, json.dumps([{"rank": 1, "team_id": "red"}]), scope="teams")

    await migrate(url)

    await check_schema(db)
    async with db.connect() as conn:
        assert await conn.run_sync(_differences) == []
        count = "SELECT COUNT(*) FROM snapshot_users WHERE user_id = :user"
        assert (await conn.execute(text(count), {"user": "kept"})).scalar() == 1201
        assert (await conn.execute(text(count), {"user": "u-1200"})).scalar() == 1
        total = (await conn.execute(text("SELECT COUNT(*) FROM snapshot_users"))).scalar()
        assert total == 2 * 1201

    await alembic_to(url, "downgrade", "0012")
    async with db.connect() as conn:
        assert "snapshot_users" not in await conn.run_sync(_tables)
        assert (await conn.execute(text("SELECT COUNT(*) FROM snapshots"))).scalar() == 1202
    await migrate(url)
    await check_schema(db)


@pytest.mark.parametrize(
    ("server", "said"),
    [
        ("root@127.0.0.1:1", "Can't connect to MySQL server"),  # nothing listens on port 1
        ("root:not-the-password@127.0.0.1:3306", "Access denied"),
    ],
)
def test_a_migration_mysql_does_not_let_in_says_so_in_one_line(server: str, said: str) -> None:
    """`make migrate` against a MySQL that does not answer or refuses the user: one JSON line
    naming the server and the setting (never the URL, which holds the password), status 1."""
    done = subprocess.run(
        [sys.executable, "-m", "services.history.migrate"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "LADDER_MYSQL_URL": f"mysql+asyncmy://{server}/ladder"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    [line] = done.stdout.splitlines()
    logged = json.loads(line)
    where = server.rpartition("@")[2]
    assert logged["message"].startswith(f"cannot connect to MySQL at {where} (LADDER_MYSQL_URL): ")
    assert said in logged["message"]
    assert (logged["level"], logged["service"], logged["server"]) == (
        "error",
        "history-migrate",
        where,
    )
    assert "not-the-password" not in done.stdout + done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(("argument", "status"), [("--help", 0), ("--dry-run", 2)])
async def test_the_migration_given_an_argument_migrates_nothing(
    settings: LadderSettings, argument: str, status: int
) -> None:
    """`--help` says what the migration does, and an argument it does not take is refused:
    neither creates the database nor touches its schema (an upgrade waits for every service to
    stop)."""
    async with scratch_database(settings, "h") as url:
        done = await asyncio.to_thread(
            run,
            [sys.executable, "-m", "services.history.migrate", argument],
            env={"PATH": "/usr/bin:/bin", "LADDER_MYSQL_URL": url},
        )
        assert done.returncode == status, done.stdout + done.stderr
        assert "usage: python -m services.history.migrate" in done.stdout + done.stderr
        base, _, name = url.rpartition("/")
        server = create_async_engine(base, poolclass=NullPool)
        try:
            async with server.connect() as conn:
                found = await conn.execute(
                    text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :n"),
                    {"n": name},
                )
                assert found.first() is None
        finally:
            await server.dispose()
