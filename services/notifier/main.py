"""The notifier: bracket crossings and badge awards, published to Redis Pub/Sub.

Run as ``python -m services.notifier``. Start-up serves the ops endpoints (not ready until what
follows is open), opens Redis (loading the function library), then the consumer; shutdown goes
in reverse (see :func:`shared.service.consume`).
"""

from __future__ import annotations

from services.notifier.handlers import Notify
from shared import service
from shared.boards import BoardCatalog
from shared.erasure import Tombstones, skipping
from shared.keys import Keys
from shared.settings import LadderSettings


async def run(settings: LadderSettings) -> None:
    """Consume until a signal asks to stop (or the consumer fails, which raises)."""
    keys = Keys(settings.key_prefix)
    async with (
        service.serving_ops(settings, settings.notifier_port, ("broker", "redis")) as opening,
        opening.redis(settings) as redis,
    ):
        tombstones = Tombstones(redis, keys, settings.effective_jwt_secret)
        handler = skipping("notifier", tombstones, Notify(redis, keys, BoardCatalog(redis, keys)))
        runner = service.consumer("notifier", settings, handler)
        await service.consume(runner, redis, settings, opening)


def main() -> None:
    service.run("notifier", run)
