"""The notifier: who entered a top bracket, who was overtaken; published to Redis Pub/Sub."""

from __future__ import annotations

import asyncio

from services.notifier.handlers import Notify
from shared import service
from shared.boards import BoardCatalog
from shared.consumer import ConsumerRunner
from shared.keys import Keys
from shared.logs import configure
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import Topology


async def main(stop: asyncio.Event, settings: LadderSettings | None = None) -> None:
    settings = settings or LadderSettings()
    keys = Keys(settings.key_prefix)
    async with open_redis(settings.redis_url) as redis:
        catalog = BoardCatalog(redis, keys)
        runner = ConsumerRunner(
            name="notifier",
            amqp_url=settings.amqp_url,
            topology=Topology(settings.broker_prefix, settings.delivery_limit),
            handler=Notify(redis, keys, catalog),
            prefetch=settings.consumer_prefetch,
        )

        async def redis_up() -> bool:
            return bool(await redis.ping())

        async def broker_up() -> bool:
            return runner.ready

        await service.consume(
            runner,
            stop,
            host=settings.ops_host,
            port=settings.notifier_port,
            checks={"broker": broker_up, "redis": redis_up},
            grace_seconds=settings.shutdown_grace_seconds,
        )


def entry() -> None:
    settings = LadderSettings()
    configure("notifier", settings.log_level)
    service.run(lambda stop: main(stop, settings))
