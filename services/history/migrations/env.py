"""Alembic's environment for the history database.

``services.history.migrate`` hands over a connection it already holds (with the migration lock
taken) as ``config.attributes["connection"]``; the alembic CLI gets a fresh async engine run on
its own event loop. Both compare against ``shared.db.metadata``.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from shared.db import metadata

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    # Only the CLI gets here; it is an entry point, so it may build the settings itself.
    from shared.settings import LadderSettings

    return LadderSettings().mysql_url


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        compare_server_default=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_online() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(run_on)
    finally:
        await engine.dispose()


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
elif (shared_connection := config.attributes.get("connection")) is not None:
    run_on(shared_connection)
else:
    asyncio.run(run_online())
