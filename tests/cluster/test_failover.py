"""A Redis primary killed under a stream of writes, on a private cluster of this test alone: its
replica takes over, writes resume within 15 s, and the hub's Pub/Sub connection, which was on
that primary, moves to another node and tells its clients to resync."""

from __future__ import annotations

import asyncio
import functools
import signal
import time

import pytest
from redis.asyncio import Redis

from services.api.push.hub import RESYNC, Hub
from shared.boards import Board
from shared.keys import Keys
from shared.redis import open_redis
from shared.redis_cluster import LadderCluster
from shared.settings import LadderSettings
from tests.api.helpers import MAIN, add_board, score
from tests.cluster.conftest import on
from tests.helpers import SERVER, api_client, eventually
from tests.redis_cluster import PrivateCluster

pytestmark = pytest.mark.cluster

RESUME_WITHIN = 15.0


class Inbox:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def deliver(self, text: str, channel: str = "") -> None:
        self.messages.append(text)


def board_on(cluster: PrivateCluster, redis: Redis, keys: Keys, port: int) -> str:
    """A board id whose slot the primary on ``port`` serves."""
    for i in range(1000):
        slot = redis.keyslot(keys.tag(f"f{i}"))  # type: ignore[attr-defined]
        if cluster.port_of_slot(slot) == port:
            return f"f{i}"
    raise LookupError(port)


async def test_a_primary_killed_under_writes_is_replaced_and_the_hub_resyncs(
    own_cluster: PrivateCluster, quiet: LadderSettings, keys: Keys
) -> None:
    settings = on(own_cluster, quiet)
    async with open_redis(settings.redis_url, load_functions=True, cluster=True) as redis:
        assert isinstance(redis, LadderCluster)
        nodes = functools.partial(redis.node_urls, settings.redis_url)
        hub = Hub(settings.redis_url, "ladder-hub-failover", nodes)
        victim = int(hub.url.rsplit(":", 1)[1].split("/")[0])
        assert victim in own_cluster.primaries()
        board_id = board_on(own_cluster, redis, keys, victim)
        await add_board(redis, keys, Board.model_validate({**MAIN, "board_id": board_id}))
        inbox, channel = Inbox(), keys.user_channel("u-1")
        listening = asyncio.create_task(hub.run())
        try:
            await hub.subscribe(channel, inbox)
            answers: list[tuple[float, int]] = []
            async with api_client(settings) as client:

                async def write(n: int) -> None:
                    body = score(user_id=f"u-{n % 50}", value=1)
                    path = f"/v1/boards/{board_id}/scores"
                    response = await client.post(path, json=body, headers=SERVER)
                    answers.append((time.monotonic(), response.status_code))

                for n in range(20):
                    await write(n)
                assert {status for _, status in answers} == {200}
                killed = time.monotonic()
                own_cluster.kill(victim)
                n = 20
                while time.monotonic() - killed < RESUME_WITHIN + 5:
                    await write(n)
                    n += 1
                    if answers[-1][1] == 200 and answers[-1][0] > killed + 0.5:
                        break
                    await asyncio.sleep(0.05)
                resumed = next(t for t, status in answers if t > killed and status == 200)
                failed = sum(1 for t, status in answers if t > killed and status != 200)
                print(f"writes resumed {resumed - killed:.1f} s after the kill ({failed} refused)")
                assert resumed - killed < RESUME_WITHIN
                assert victim not in own_cluster.primaries()
            await eventually(lambda: _true(RESYNC in inbox.messages), within=15)
            assert hub.url != f"redis://127.0.0.1:{victim}/0"
            await redis.publish(channel, "after")
            await eventually(lambda: _true("after" in inbox.messages), within=5)
        finally:
            hub.stop()
            await listening


async def test_pushes_lost_on_a_stalled_node_link_make_the_hub_resync(
    own_cluster: PrivateCluster, keys: Keys
) -> None:
    """The hub's node (a replica here, so that no failover follows) stalls for longer than half
    the cluster's node timeout: the primaries drop their cluster bus links to it and make new
    ones, and what they published in between never reaches it, while the hub's connection stays
    up. Every push published meanwhile arrives, or the hub tells its clients to resync."""
    async with open_redis(own_cluster.url, cluster=True) as redis:
        assert isinstance(redis, LadderCluster)
        replica = next(port for port, role in own_cluster.roles().items() if role == "slave")
        url = f"redis://127.0.0.1:{replica}/0"
        hub = Hub(url, "ladder-hub-stall", lambda: [url])
        inbox, channel = Inbox(), keys.user_channel("u-stall")
        listening = asyncio.create_task(hub.run())
        try:
            await hub.subscribe(channel, inbox)
            await redis.publish(channel, "before")
            await eventually(lambda: _true("before" in inbox.messages), within=5)
            sent = []
            own_cluster.processes[replica].send_signal(signal.SIGSTOP)
            try:
                stalled = time.monotonic()
                while time.monotonic() - stalled < 2.5:  # the node timeout is 2 s
                    sent.append(f"during-{len(sent)}")
                    await redis.publish(channel, sent[-1])
                    await asyncio.sleep(0.01)
            finally:
                own_cluster.processes[replica].send_signal(signal.SIGCONT)
            await redis.publish(channel, "after")
            await eventually(lambda: _true("after" in inbox.messages), within=10)
            await asyncio.sleep(2)  # the hub looks at its links every second
            lost = [text for text in sent if text not in inbox.messages]
            print(f"{len(lost)} of {len(sent)} pushes lost; resync: {RESYNC in inbox.messages}")
            assert not lost or RESYNC in inbox.messages[inbox.messages.index("before") :]
        finally:
            hub.stop()
            await listening


async def _true(value: bool) -> bool:
    return value
