"""The notifier: bracket crossings and badge awards, published to Redis Pub/Sub.

Run as ``python -m services.notifier``. Start-up serves the ops endpoints (not ready until what
follows is open), opens Redis (loading the function library), then the consumer; shutdown goes
in reverse (see :func:`shared.service.consume`).
"""

from __future__ import annotations

from redis.asyncio import Redis

from services.notifier.handlers import Notify
from services.notifier.late_erasures import LateErasures
from shared import service
from shared.boards import BoardCatalog
from shared.consumer import Handler
from shared.erasure import Tombstones, skipping
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings


def batch_handler(redis: Redis, keys: Keys, catalog: BoardCatalog, secret: str) -> Handler:
    """The consumer's handler of a batch: erased users' and deleted boards' events in flight are
    left out (read from the Redis projections), and what the batch wrote for a user erased or a
    board deleted while it went in is taken out again after the write (``LateErasures``)."""
    notify, late = Notify(redis, keys, catalog), LateErasures(redis, keys, secret)

    async def handle(events: list[ScoreAccepted]) -> None:
        await notify(events)
        await late(events)  # after the write: see LateErasures

    return skipping("notifier", Tombstones(redis, keys, secret), handle)


async def run(settings: LadderSettings) -> None:
    """Consume until a signal asks to stop (or the consumer fails, which raises)."""
    keys = Keys(settings.key_prefix)
    async with (
        service.serving_ops(settings, settings.notifier_port, ("broker", "redis")) as opening,
        opening.redis(settings) as redis,
    ):
        catalog = BoardCatalog(redis, keys)
        handler = batch_handler(redis, keys, catalog, settings.effective_jwt_secret)
        runner = service.consumer("notifier", settings, handler)
        await service.consume(runner, redis, settings, opening)


def main() -> None:
    service.run("notifier", run)
