"""Remove everything Ladder made, for one set of prefixes (``make clean``).

- Redis: every key of ``LADDER_KEY_PREFIX`` (``P:*`` and the board keys ``{P:*``), found with
  SCAN and removed with UNLINK, a batch at a time. Never FLUSHALL: the server may hold others'
  keys. The Redis Functions library stays (it is shared and holds no data).
- RabbitMQ: the queues and exchanges Ladder makes under ``LADDER_BROKER_PREFIX``, by name: those
  the topology declares (shared/topology.py) and the simulation's control exchange. Never every
  name that begins with the prefix: a prefix may hold dots, so ``ladder.staging`` is another
  installation whose names all begin with ``ladder.``, and a game backend's own queue (bound to
  ``ladder.periods``) may be named after Ladder's.
- MySQL: the history database named in ``LADDER_MYSQL_URL``, quoted as the migration quotes it
  when it creates it; never one of the server's own schemas.

What it refuses, it refuses before it removes anything. Safe to run twice: what is already gone
is skipped. It does not stop or start services; ``make clean`` does that around it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

import aio_pika
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from shared.amqp import connect as connect_broker
from shared.failures import short_reason
from shared.redis import open_redis
from shared.settings import LadderSettings, load_settings
from shared.topology import Topology
from sim.control import exchange_name as control_exchange

T = TypeVar("T")
SCAN_COUNT = 1000
# The server's own schemas, compared in lower case: MySQL's information_schema and
# performance_schema are that in any case.
SERVER_SCHEMAS = frozenset({"information_schema", "mysql", "performance_schema", "sys"})


async def clean_redis(settings: LadderSettings) -> int:
    prefix, removed = settings.key_prefix, 0
    async with open_redis(settings.redis_url, cluster=settings.redis_cluster) as redis:
        for pattern in (f"{prefix}:*", "{" + prefix + ":*"):
            batch: list[str] = []
            async for key in redis.scan_iter(match=pattern, count=SCAN_COUNT):
                batch.append(key)
                if len(batch) >= SCAN_COUNT:
                    removed += await redis.unlink(*batch)
                    batch = []
            if batch:
                removed += await redis.unlink(*batch)
    return removed


async def clean_broker(settings: LadderSettings) -> tuple[int, int]:
    prefix = settings.broker_prefix
    topology = Topology(prefix=prefix)
    queues = set(topology.queues)
    exchanges = {*topology.exchanges, control_exchange(prefix)}
    gone_queues = gone_exchanges = 0
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        for name in sorted(queues):
            channel = await connection.channel()
            try:
                await channel.get_queue(name, ensure=True)
            except aio_pika.exceptions.ChannelNotFoundEntity:
                continue  # already gone; the failed check closed that channel
            await channel.queue_delete(name)
            gone_queues += 1
            await channel.close()
        for name in sorted(exchanges):
            channel = await connection.channel()
            try:
                await channel.get_exchange(name, ensure=True)
            except aio_pika.exceptions.ChannelNotFoundEntity:
                continue
            await channel.exchange_delete(name)
            gone_exchanges += 1
            await channel.close()
    return gone_queues, gone_exchanges


def history_database(settings: LadderSettings) -> str | None:
    """The database ``clean_mysql`` drops, if the URL names one; raises SystemExit for one of
    the server's own schemas, which no setting should name and nothing may drop."""
    database = make_url(settings.mysql_url).database
    if database and database.lower() in SERVER_SCHEMAS:
        raise SystemExit(
            f"clean: refusing to drop {database!r}, one of the MySQL server's own schemas "
            f"(LADDER_MYSQL_URL names it); nothing was removed"
        )
    return database or None


async def clean_mysql(settings: LadderSettings) -> str | None:
    database = history_database(settings)
    if database is None:
        return None
    engine = create_async_engine(make_url(settings.mysql_url).set(database=""))
    try:
        quoted = engine.dialect.identifier_preparer.quote_identifier(database)
        async with engine.begin() as conn:
            found = await conn.execute(
                text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :name"),
                {"name": database},
            )
            if found.first() is None:
                return None
            await conn.execute(text(f"DROP DATABASE {quoted}"))
    finally:
        await engine.dispose()
    return database


async def _using(setting: str, step: Awaitable[T]) -> T:
    """What ``step`` gives; a server it cannot reach or use ends clean with one line naming the
    setting to check and the error, without an address (SystemExit, status 1)."""
    try:
        return await step
    except (RedisError, DBAPIError, *CONNECTION_EXCEPTIONS) as error:
        raise SystemExit(
            f"clean: stopped: the server of {setting} cannot be used ({short_reason(error)}); "
            "what was removed before stays removed: run clean again once it answers"
        ) from None


async def clean(settings: LadderSettings) -> None:
    # Refused before anything is removed, so that a refusal leaves the prefixes whole.
    history_database(settings)
    keys = await _using("LADDER_REDIS_URL", clean_redis(settings))
    queues, exchanges = await _using("LADDER_AMQP_URL", clean_broker(settings))
    database = await _using("LADDER_MYSQL_URL", clean_mysql(settings))
    print(
        f"clean: {keys} Redis keys under {settings.key_prefix!r}, {queues} queues and "
        f"{exchanges} exchanges under {settings.broker_prefix!r}, "
        + (f"database {database!r} dropped" if database else "no history database")
    )


def main(argv: list[str] | None = None) -> int:
    # No argument is taken: ``--help`` prints this and removes nothing, and any other argument
    # is refused (status 2) before the settings are read, let alone anything removed.
    argparse.ArgumentParser(
        prog="scripts/clean.py",
        description="Remove everything Ladder made under LADDER_KEY_PREFIX and "
        "LADDER_BROKER_PREFIX (its Redis keys, queues and exchanges) and the history database "
        "of LADDER_MYSQL_URL (make clean). Takes no arguments: the settings say what.",
    ).parse_args(argv)
    asyncio.run(clean(load_settings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
