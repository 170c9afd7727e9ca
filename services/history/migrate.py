"""Bring the history database to the newest schema: ``python -m services.history.migrate``.

Creates the database named in ``LADDER_MYSQL_URL`` if it is missing, then runs
``alembic upgrade head``. Safe to repeat, and safe to run from several processes at once: a
MySQL named lock lets one migrate while the others wait and then find nothing to do. The
services never migrate by themselves; they only :func:`check_schema` at start (waiting for
MySQL if it does not answer yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

log = structlog.get_logger(__name__)

ALEMBIC_INI = Path(__file__).with_name("alembic.ini")
LOCK_TIMEOUT_SECONDS = 120


class SchemaNotReady(RuntimeError):
    """The database is not at the schema this code needs; run the migration first."""

    def __init__(self, current: set[str], needed: set[str]) -> None:
        super().__init__(
            f"history database is at revision {sorted(current) or 'none'}, this code needs "
            f"{sorted(needed)}: run `python -m services.history.migrate` (make up does)"
        )
        self.current = current
        self.needed = needed


class MySQLUnreachable(ConnectionError):
    """The migration's first connection to MySQL failed: the server does not answer, or refuses
    the URL's user. Said in one line, naming the server, never the URL (it may hold a
    password)."""

    def __init__(self, server: str, error: Exception) -> None:
        orig: BaseException = getattr(error, "orig", None) or error
        args = orig.args
        reason = f"{args[1]} ({args[0]})" if len(args) == 2 else str(orig)
        super().__init__(f"cannot connect to MySQL at {server} (LADDER_MYSQL_URL): {reason}")
        self.server = server


def server_of(url: URL) -> str:
    """Where the server of ``url`` is, for a message: ``host:port``, or its socket."""
    socket_path = url.query.get("unix_socket")
    if socket_path:
        return str(socket_path)
    host = url.host or "localhost"
    return f"[{host}]:{url.port or 3306}" if ":" in host else f"{host}:{url.port or 3306}"


async def _reach(engine: AsyncEngine, url: URL) -> None:
    try:
        async with engine.connect():
            pass
    except (DBAPIError, OSError) as error:
        raise MySQLUnreachable(server_of(url), error) from error


def alembic_config() -> Config:
    return Config(str(ALEMBIC_INI))


async def migrate(mysql_url: str) -> None:
    """Create the database of ``mysql_url`` if needed and upgrade it to the newest revision."""
    url = make_url(mysql_url)
    database = url.database
    if not database:
        raise ValueError("the MySQL URL names no database")

    # URL.set() ignores None; _replace is the documented way to drop the database.
    server = create_async_engine(url._replace(database=None), poolclass=NullPool)
    try:
        await _reach(server, url)
        quoted = server.dialect.identifier_preparer.quote_identifier(database)
        async with server.begin() as conn:
            # Looked up first only to keep the server's "database exists" note out of the logs.
            exists = await conn.scalar(
                text("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :name"),
                {"name": database},
            )
            if not exists:
                await conn.execute(
                    text(f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4")
                )
    finally:
        await server.dispose()

    # NullPool: the connection really closes at the end, and with it goes the named lock, even
    # when the upgrade fails half way.
    db = create_async_engine(url, poolclass=NullPool)
    lock = f"ladder.migrate.{database}"[:64]
    try:
        async with db.connect() as conn:
            got = await conn.scalar(
                text("SELECT GET_LOCK(:name, :timeout)"),
                {"name": lock, "timeout": LOCK_TIMEOUT_SECONDS},
            )
            if got != 1:
                raise TimeoutError(f"another migration of {database!r} holds the lock")
            # Start alembic on a fresh transaction, so it reads what a previous holder committed.
            await conn.commit()
            await conn.run_sync(_upgrade, alembic_config())
            # Committed before the lock goes, or a waiting process would migrate again.
            await conn.commit()
            await conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": lock})
    finally:
        await db.dispose()
    log.info("history database migrated", database=database)


def _upgrade(connection: Connection, config: Config) -> None:
    # env.py runs on this connection instead of opening its own event loop and engine.
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


async def check_schema(engine: AsyncEngine) -> None:
    """Raise :class:`SchemaNotReady` unless the database has this code's newest revision.

    A revision this code does not know is taken as a newer release's migration, which by
    convention stays compatible with the code before it: a warning, not a refusal.
    """
    script = ScriptDirectory.from_config(alembic_config())
    needed = set(script.get_heads())
    async with engine.connect() as conn:
        current = await conn.run_sync(_current_heads)
    if current == needed:
        return
    try:
        for revision in current:
            script.get_revision(revision)
    except CommandError:
        log.warning("history database is ahead of this code", current=sorted(current))
        return
    raise SchemaNotReady(current, needed)


async def wait_for_schema(
    engine: AsyncEngine,
    *,
    retry_seconds: float = 1.0,
    waiting: Callable[[BaseException], None] | None = None,
) -> None:
    """:func:`check_schema`, waiting while MySQL does not answer rather than failing.

    A service that starts during a database outage waits for it (logging each failed try, with
    a back-off up to 15 s, and handing it to ``waiting``, for its ``/readyz`` to say why it is
    not ready yet) instead of exiting and being given up on by its process manager; a database
    that answers with the wrong schema still raises :class:`SchemaNotReady` at once.
    """
    delay = retry_seconds
    while True:
        try:
            await check_schema(engine)
            return
        except (DBAPIError, OSError) as error:
            if waiting is not None:
                waiting(error)
            log.warning(
                "MySQL is not answering; waiting for it", retry_in_s=delay, error=str(error)
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 15.0)


def _current_heads(connection: Connection) -> set[str]:
    return set(MigrationContext.configure(connection).get_current_heads())


if __name__ == "__main__":
    import argparse

    from shared.logs import configure
    from shared.settings import load_settings

    # No argument is taken: ``--help`` says what this does and migrates nothing (an upgrade
    # waits until every service is stopped), and any other argument is refused (status 2).
    argparse.ArgumentParser(
        prog="python -m services.history.migrate",
        description="Create the history database of LADDER_MYSQL_URL if it does not exist and "
        "bring its schema to this release's (make migrate). Takes no arguments.",
    ).parse_args()
    settings = load_settings("history-migrate")
    configure("history-migrate", settings.log_level)
    try:
        asyncio.run(migrate(settings.mysql_url))
    except MySQLUnreachable as error:
        log.error(str(error), server=error.server)
        raise SystemExit(1) from None
    except TimeoutError as error:  # another migration held the lock all along
        log.error(str(error))
        raise SystemExit(1) from None
