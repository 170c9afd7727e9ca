"""Remove everything Ladder made, for one set of prefixes (``make clean``).

- Redis: every key of ``LADDER_KEY_PREFIX`` (``P:*`` and the board keys ``{P:*``), found with
  SCAN and removed with UNLINK, a batch at a time. Never FLUSHALL: the server may hold others'
  keys. The Redis Functions library stays (it is shared and holds no data).
- RabbitMQ: the queues and exchanges of ``LADDER_BROKER_PREFIX`` (``P.*``): those the topology
  declares, the simulation's control exchange, and any other of the prefix that ``rabbitmqctl``
  lists when it can reach the broker (the local node, or the one ``RABBITMQ_NODENAME`` names).
- MySQL: the history database named in ``LADDER_MYSQL_URL``.

Safe to run twice: what is already gone is skipped. It does not stop or start services;
``make clean`` does that around it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys

import aio_pika
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from shared.amqp import connect as connect_broker
from shared.redis import open_redis
from shared.settings import LadderSettings, load_settings
from shared.topology import CONSUMERS, Topology
from sim.control import exchange_name as control_exchange

SCAN_COUNT = 1000
DATABASE_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")


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


def listed(kind: str, prefix: str) -> list[str]:
    """Names of ``kind`` (``queues`` or ``exchanges``) of the prefix that rabbitmqctl lists; empty
    when rabbitmqctl is not here or cannot reach the node (a remote broker)."""
    tool = shutil.which("rabbitmqctl")
    if tool is None:
        return []
    try:
        done = subprocess.run(
            [tool, "-q", f"list_{kind}", "name", "--formatter", "json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        names = [row["name"] for row in json.loads(done.stdout or "[]")]
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, TypeError):
        return []
    return [n for n in names if isinstance(n, str) and n.startswith(f"{prefix}.")]


async def clean_broker(settings: LadderSettings) -> tuple[int, int]:
    prefix = settings.broker_prefix
    topology = Topology(prefix=prefix)
    queues = {topology.queue(c) for c in CONSUMERS} | {topology.dead_queue(c) for c in CONSUMERS}
    exchanges = {topology.scores_exchange, control_exchange(prefix)}
    queues |= set(listed("queues", prefix))
    exchanges |= set(listed("exchanges", prefix))
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


async def clean_mysql(settings: LadderSettings) -> str | None:
    url = make_url(settings.mysql_url)
    database = url.database
    if not database:
        return None
    if not DATABASE_NAME.match(database):
        raise SystemExit(f"clean: refusing an unusual database name {database!r}")
    engine = create_async_engine(url.set(database=""))
    try:
        async with engine.begin() as conn:
            found = await conn.execute(
                text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :name"),
                {"name": database},
            )
            if found.first() is None:
                return None
            await conn.execute(text(f"DROP DATABASE `{database}`"))
    finally:
        await engine.dispose()
    return database


async def clean(settings: LadderSettings) -> None:
    keys = await clean_redis(settings)
    queues, exchanges = await clean_broker(settings)
    database = await clean_mysql(settings)
    print(
        f"clean: {keys} Redis keys under {settings.key_prefix!r}, {queues} queues and "
        f"{exchanges} exchanges under {settings.broker_prefix!r}, "
        + (f"database {database!r} dropped" if database else "no history database")
    )


def main() -> int:
    asyncio.run(clean(load_settings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
