"""The history database a test gets: a copy of one migrated once per session.

Migrating a fresh database with alembic takes a tenth of a second or more; several hundred tests
need one. The session migrates a template database once and each test's database is made from
it: ``CREATE TABLE ... LIKE`` of each of its tables (columns, types, defaults, keys and
indexes, engine and character set) and a copy of the rows those tables hold, alembic's
revision among them, so that code checking the schema sees head. What ``LIKE`` would not
carry over (views, triggers, routines, events, foreign keys, check constraints) is looked for in
the template; should a migration ever make any, every test's database is migrated for real
instead. The migrations' own tests (tests/history/test_migrations.py) always migrate for real.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from tests.helpers import server_statement

# What CREATE TABLE ... LIKE leaves behind, each counted in the template's schema.
NOT_COPIED = {
    "views": "SELECT COUNT(*) FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = :db AND TABLE_TYPE <> 'BASE TABLE'",
    "triggers": "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = :db",
    "routines": "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = :db",
    "events": "SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_SCHEMA = :db",
    "foreign keys": "SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS "
    "WHERE CONSTRAINT_SCHEMA = :db",
    "check constraints": "SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS "
    "WHERE CONSTRAINT_SCHEMA = :db",
}


class MigratedTemplate:
    """A database named ``name`` on the server of ``server_url``, migrated to head on the first
    :meth:`copy_to`; :meth:`drop` removes it."""

    def __init__(self, server_url: str, name: str) -> None:
        self.server_url = server_url
        self.name = name
        self.migrated = False
        self.copyable = False
        self.tables: list[str] = []
        self.filled: list[str] = []  # the tables that hold rows
        self.charset = "CHARACTER SET utf8mb4"

    async def copy_to(self, url: str) -> None:
        """Make the database of ``url`` (which must not exist) a copy of the template."""
        if not self.migrated:
            await self._migrate()
        if not self.copyable:
            from services.history.migrate import migrate

            await migrate(url)
            return
        database = make_url(url).database
        engine = create_async_engine(self.server_url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                await conn.execute(text(f"CREATE DATABASE `{database}` {self.charset}"))
                for table in self.tables:
                    await conn.execute(
                        text(f"CREATE TABLE `{database}`.`{table}` LIKE `{self.name}`.`{table}`")
                    )
                for table in self.filled:
                    await conn.execute(
                        text(
                            f"INSERT INTO `{database}`.`{table}` "
                            f"SELECT * FROM `{self.name}`.`{table}`"
                        )
                    )
                await conn.commit()
        except BaseException:
            await server_statement(self.server_url, f"DROP DATABASE IF EXISTS `{database}`")
            raise
        finally:
            await engine.dispose()

    async def _migrate(self) -> None:
        from services.history.migrate import migrate

        await migrate(f"{self.server_url}/{self.name}")
        self.migrated = True
        engine = create_async_engine(self.server_url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                await self._read(conn)
        finally:
            await engine.dispose()

    async def _read(self, conn: AsyncConnection) -> None:
        db = {"db": self.name}
        for query in NOT_COPIED.values():
            if await conn.scalar(text(query), db):
                return  # self.copyable stays False: every database is migrated for real
        charset, collation = (
            await conn.execute(
                text(
                    "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME "
                    "FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :db"
                ),
                db,
            )
        ).one()
        self.charset = f"CHARACTER SET {charset} COLLATE {collation}"
        self.tables = list(
            (
                await conn.scalars(
                    text(
                        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = :db"
                    ),
                    db,
                )
            ).all()
        )
        for table in self.tables:
            if await conn.scalar(text(f"SELECT EXISTS (SELECT 1 FROM `{self.name}`.`{table}`)")):
                self.filled.append(table)
        self.copyable = True

    def drop(self) -> None:
        if self.migrated:
            asyncio.run(server_statement(self.server_url, f"DROP DATABASE IF EXISTS `{self.name}`"))
