"""What a run ran on: the machine, and the versions of every server and library it measured."""

from __future__ import annotations

import os
import platform
from importlib import metadata

from sqlalchemy import text

from bench import load
from bench.probes import Ladder
from shared.amqp import connect as connect_broker
from shared.db import open_engine
from shared.settings import LadderSettings


async def versions(settings: LadderSettings, ladder: Ladder) -> dict[str, str]:
    info = await ladder.redis.info("server")
    out = {
        "Python": platform.python_version(),
        "Redis": str(info["redis_version"]),
        "uvicorn": metadata.version("uvicorn"),
        "FastAPI": metadata.version("fastapi"),
        "redis-py": metadata.version("redis"),
        "aio-pika": metadata.version("aio-pika"),
        "wrk": load.wrk_version().split()[1].removeprefix("debian/"),
    }
    async with open_engine(settings.mysql_url) as engine, engine.connect() as conn:
        out["MariaDB"] = str((await conn.execute(text("SELECT VERSION()"))).scalar_one())
    connection = await connect_broker(settings.amqp_urls)
    try:
        props = connection.transport.connection.server_properties if connection.transport else {}
        out["RabbitMQ"] = str(props.get("version", "?"))
    finally:
        await connection.close()
    return out


def machine() -> str:
    cores = os.cpu_count()
    with open("/proc/meminfo") as meminfo:
        total_kb = int(meminfo.readline().split()[1])
    return f"{cores} cores, {total_kb / 1024 / 1024:.1f} GiB RAM, {platform.platform()}"
