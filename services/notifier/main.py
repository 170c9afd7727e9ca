"""The notifier: bracket crossings and badge awards, published to Redis Pub/Sub."""

from __future__ import annotations

from services.notifier.handlers import Notify
from shared import service
from shared.boards import BoardCatalog
from shared.consumer import ConsumerRunner
from shared.keys import Keys
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import Topology


async def run(settings: LadderSettings) -> None:
    keys = Keys(settings.key_prefix)
    async with open_redis(settings.redis_url, load_functions=True) as redis:
        runner = ConsumerRunner(
            name="notifier",
            amqp_url=settings.amqp_url,
            topology=Topology(settings.broker_prefix, settings.delivery_limit),
            handler=Notify(redis, keys, BoardCatalog(redis, keys)),
            prefetch=settings.consumer_prefetch,
        )
        await service.consume(
            runner,
            host=settings.ops_host,
            port=settings.notifier_port,
            checks=service.checks_of(runner, redis),
            grace_seconds=settings.shutdown_grace_seconds,
        )


def main() -> None:
    service.run("notifier", run)
