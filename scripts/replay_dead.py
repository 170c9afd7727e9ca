"""Send a consumer's dead letters back to its own queue (``make replay-dead QUEUE=history``).

A message in ``<prefix>.scores.<consumer>.dead`` was dead-lettered by that consumer alone: the
other two took it already. Published again to the ``ladder.scores`` exchange, a fanout, it would
reach all three queues, and the aggregator and the notifier would take its events a second time
once their records have expired in Redis (docs/api.md section 8). So each message is published
to the consumer's own queue (the default exchange, the queue's name for routing key), with a
publisher confirm, and only then acknowledged in ``.dead``: a message is moved, never lost, and a
crash in between leaves it in both places, which the consumer takes once.

The messages in ``.dead`` when it starts are moved, and no more: one that comes back meanwhile
(an event the consumers' schema still refuses) stays there. Its body and its properties are kept;
the headers the broker added (``x-death``, ``x-delivery-count``) are dropped, so that the queue
counts its deliveries from the first again.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import cast

import aio_pika
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import CONNECTION_EXCEPTIONS

from shared.amqp import connect as connect_broker
from shared.failures import short_reason
from shared.settings import LadderSettings, load_settings
from shared.topology import CONSUMERS, Consumer, Topology

# Headers the broker puts on a dead-lettered or redelivered message.
BROKER_HEADERS = frozenset(
    {
        "x-death",
        "x-delivery-count",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
    }
)


async def replay(settings: LadderSettings, consumer: Consumer) -> int:
    """Move the messages of ``consumer``'s ``.dead`` queue to its queue; how many were moved."""
    topology = Topology(settings.broker_prefix, settings.delivery_limit)
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        return await move(channel, topology.dead_queue(consumer), topology.queue(consumer))


async def move(channel: AbstractChannel, source: str, target: str) -> int:
    """The messages in ``source`` now, each published to ``target`` (confirmed) and then
    acknowledged; how many."""
    dead = await channel.declare_queue(source, passive=True)
    # It must exist (a passive declaration raises otherwise), or a message would be dropped.
    await channel.declare_queue(target, passive=True)
    count = dead.declaration_result.message_count or 0
    moved = 0
    while moved < count:
        message = await dead.get(no_ack=False, fail=False)
        if message is None:
            break
        headers = {k: v for k, v in (message.headers or {}).items() if k not in BROKER_HEADERS}
        again = aio_pika.Message(
            message.body,
            headers=headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=message.message_id,
            type=message.type,
            timestamp=message.timestamp,
        )
        await channel.default_exchange.publish(again, routing_key=target, mandatory=True)
        await message.ack()
        moved += 1
    return moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/replay_dead.py",
        description="Move a consumer's dead letters back to its own queue.",
    )
    parser.add_argument("consumer", choices=CONSUMERS, help="whose .dead queue")
    options = parser.parse_args(argv)
    settings = load_settings("replay-dead")
    consumer = cast(Consumer, options.consumer)
    topology = Topology(settings.broker_prefix)
    try:
        moved = asyncio.run(replay(settings, consumer))
    except aio_pika.exceptions.ChannelNotFoundEntity as exc:
        # The queue is not there (another LADDER_BROKER_PREFIX?): nothing was moved.
        print(f"replay-dead: nothing moved: {exc}", file=sys.stderr)
        return 1
    except CONNECTION_EXCEPTIONS as exc:
        # No broker answers there, it refuses the user, or it went away midway: the setting to
        # check, not a traceback, and no address (the URL may hold a password). What was moved
        # stays moved; what was not stays in the .dead queue.
        print(
            "replay-dead: stopped: the broker of LADDER_AMQP_URL cannot be used "
            f"({short_reason(exc)}); run it again once it answers",
            file=sys.stderr,
        )
        return 1
    print(
        f"replay-dead: {moved} message{'' if moved == 1 else 's'} from "
        f"{topology.dead_queue(consumer)} to "
        f"{topology.queue(consumer)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
