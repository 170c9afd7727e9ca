"""``make replay-dead QUEUE=<consumer>`` (scripts/replay_dead.py; docs/operations.md, "A poison
message"): a consumer's dead letters go back to its own queue alone, not through the fanout
exchange, which would hand them to the other two consumers as well, who took them already."""

from __future__ import annotations

import sys

import aio_pika
import orjson
from aio_pika.abc import AbstractChannel

from scripts.replay_dead import move
from shared.topology import CONSUMERS, Topology
from tests.helpers import UNREACHABLE_BROKER
from tests.stack import ROOT, run


async def depth(channel: AbstractChannel, name: str) -> int:
    declared = await channel.declare_queue(name, passive=True)
    return declared.declaration_result.message_count or 0


async def test_dead_letters_go_back_to_their_own_queue_alone(
    channel: AbstractChannel, broker: Topology
) -> None:
    bodies = [orjson.dumps({"schema": 1, "events": [{"n": n}]}) for n in range(3)]
    for n, body in enumerate(bodies):
        message = aio_pika.Message(
            body,
            content_type="application/json",
            message_id=f"m-{n}",
            headers={"x-death": [{"reason": "rejected"}], "x-delivery-count": 21},
        )
        await channel.default_exchange.publish(message, routing_key=broker.dead_queue("history"))

    moved = await move(channel, broker.dead_queue("history"), broker.queue("history"))

    assert moved == 3
    assert await depth(channel, broker.dead_queue("history")) == 0
    # The other consumers' queues get nothing: they handled these messages already.
    assert [await depth(channel, broker.queue(c)) for c in CONSUMERS] == [0, 3, 0]
    queue = await channel.get_queue(broker.queue("history"))
    got = [await queue.get(no_ack=True) for _ in bodies]
    assert [m.body for m in got] == bodies
    assert [m.message_id for m in got] == ["m-0", "m-1", "m-2"]
    assert all(m.content_type == "application/json" for m in got)
    # Counted from the first delivery again.
    assert all("x-death" not in (m.headers or {}) for m in got)
    assert all((m.headers or {}).get("x-delivery-count", 0) == 0 for m in got)


async def test_nothing_dead_moves_nothing(channel: AbstractChannel, broker: Topology) -> None:
    assert await move(channel, broker.dead_queue("notifier"), broker.queue("notifier")) == 0
    assert [await depth(channel, broker.queue(c)) for c in CONSUMERS] == [0, 0, 0]


def test_a_broker_that_does_not_answer_is_named_by_its_setting_in_one_line() -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "LADDER_AMQP_URL": UNREACHABLE_BROKER.replace("guest:guest", "guest:secret"),
    }
    done = run([sys.executable, "scripts/replay_dead.py", "history"], env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("replay-dead: stopped: the broker of LADDER_AMQP_URL cannot be used (")
    assert "secret" not in done.stderr
