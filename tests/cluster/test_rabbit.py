"""The four services as processes on a private three-node RabbitMQ cluster
(tests/rabbit_cluster.py), ``LADDER_AMQP_URL`` naming every node: the quorum queues have a
member on each node, and the node the consumers and the relay are connected to is stopped while
scores pour in. Every write answered 2xx is then in MySQL exactly once, every board holds each
once, and every client is connected to a live node again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.keys import Keys
from shared.redis import open_redis
from shared.settings import LadderSettings
from shared.topology import CONSUMERS, Topology
from tests.faults.checks import (
    boards_equal_history,
    consumed,
    figures,
    global_is_sum_of_regions,
    history_complete,
    nothing_left_behind,
    wait_for,
)
from tests.faults.load import Load
from tests.faults.stack import FaultStack
from tests.rabbit_cluster import QuorumQueue, RabbitCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

# As the fault suite's stacks: no rate limit is the subject, and a relay's unconfirmed entries
# are taken over soon.
ENV = {
    "LADDER_USER_RATE": "1000",
    "LADDER_KEY_RATE": "100000",
    "LADDER_RELAY_CLAIM_IDLE_MS": "2000",
    "LADDER_SHUTDOWN_GRACE_SECONDS": "5",
    "LADDER_API_WORKERS": "1",
}


@pytest.fixture(scope="module")
def rabbit_cluster() -> Iterator[RabbitCluster]:
    cluster = RabbitCluster()
    started = time.monotonic()
    cluster.start()
    print(f"\nprivate RabbitMQ cluster of 3 up in {time.monotonic() - started:.1f} s")
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def settings(settings: LadderSettings, rabbit_cluster: RabbitCluster) -> LadderSettings:
    return settings.model_copy(update={"amqp_url": rabbit_cluster.amqp_url})


@pytest.fixture
def cluster_stack(
    settings: LadderSettings, mysql_database: str, tmp_path: Path
) -> Iterator[FaultStack]:
    """The four services under supervisord, their broker the cluster (the test's Redis keys
    are removed by the ``redis`` fixture, its database dropped by ``mysql_database``)."""
    ladder = FaultStack(settings, tmp_path / "run", extra_env=ENV)
    try:
        ladder.start()
        yield ladder
    finally:
        ladder.shutdown()


class LiveNode:
    """``rabbitmqctl`` aimed at one node that is still running (for the fault suite's queue
    checks, which call ``ctl(*args)``)."""

    def __init__(self, cluster: RabbitCluster, index: int) -> None:
        self.cluster, self.index = cluster, index

    def ctl(self, *args: str) -> str:
        return self.cluster.ctl(self.index, *args)


def ladder_connections(cluster: RabbitCluster, up: list[int]) -> dict[str, int]:
    """Every Ladder connection of the cluster, as a running node lists them: its name and the
    AMQP port of the node that holds it."""
    return {name: port for name, port in cluster.connections(up[0]) if name.startswith("ladder-")}


@pytest.mark.usefixtures("redis")
async def test_a_rabbitmq_node_stopped_under_load(
    rabbit_cluster: RabbitCluster, cluster_stack: FaultStack, settings: LadderSettings
) -> None:
    cluster = rabbit_cluster
    keys = Keys(settings.key_prefix)
    topology = Topology(settings.broker_prefix, settings.delivery_limit)
    everyone = list(range(len(cluster.nodes)))

    # Every queue the services declared is a quorum queue with a member on each node.
    queues_before = await asyncio.to_thread(cluster.quorum_queues, 0)
    ours = [q for c in CONSUMERS for q in (topology.queue(c), topology.dead_queue(c))]
    for queue in ours:
        assert queue in queues_before, (queue, sorted(queues_before))
        assert queues_before[queue].members == sorted(cluster.nodes), queues_before[queue]

    async with Load(cluster_stack.api, tag="rq") as load:
        await load.more(500)
        before = await asyncio.to_thread(ladder_connections, cluster, everyone)
        roles = {name.split(" ")[0] + " " + name.split(" ")[1] for name in before}
        expected_roles = {
            "ladder-aggregator consumer",
            "ladder-history consumer",
            "ladder-notifier consumer",
            "ladder-api relay",
        }
        assert expected_roles <= roles, before
        # The node holding the consumers and the relay (with one address after another in
        # LADDER_AMQP_URL, each client is on the first that answered).
        ports = [port for name, port in before.items() if "consumer" in name or "relay" in name]
        victim_port = max(set(ports), key=ports.count)
        victim = cluster.index_of_port(victim_port)
        moved = sorted(name for name, port in before.items() if port == victim_port)
        leaders_moved = sum(queues_before[q].leader == cluster.node(victim) for q in ours)
        survivors = [i for i in everyone if i != victim]
        accepted_before = len(load.accepted)

        stopping = time.monotonic()
        await asyncio.to_thread(cluster.stop_node, victim)
        stopped = time.monotonic()

        async def all_back() -> dict[str, int] | None:
            now = await asyncio.to_thread(ladder_connections, cluster, survivors)
            back = [name for name in now if name in before]
            return now if len(back) == len(before) else None

        after = await wait_for("every Ladder connection back on a live node", all_back, 60, 0.2)
        reconnected = time.monotonic()
        # Writes go on, and are relayed, through the nodes that are left.
        await load.more(500)
        await load.stop()

    assert all(port != victim_port for port in after.values()), after
    # The same processes reconnected (a connection's name holds its pid): none exited.
    assert cluster_stack.exits() == [], cluster_stack.exits()
    # The queues led from the stopped node elected a leader among the two members left. A
    # queue whose election is still under way may be missing from `list_queues` for a moment
    # (a dead-letter queue, idle, was once): read again until every one is listed with one.
    leaders = [cluster.node(i) for i in survivors]

    async def elected() -> dict[str, QuorumQueue] | None:
        found = await asyncio.to_thread(cluster.quorum_queues, survivors[0])
        led = all(q in found and found[q].leader in leaders for q in ours)
        return found if led else None

    queues_after = await wait_for("each queue's leader on a live node", elected, 30, 0.5)
    assert all(queues_after[q].leader in leaders for q in ours)
    stored = await history_complete(settings, load, within=120)
    async with open_redis(settings.redis_url) as redis:
        matched = await boards_equal_history(redis, keys, stored)
        merged = await global_is_sum_of_regions(redis, keys, stored)
        queues = await nothing_left_behind(
            settings,
            redis,
            keys,
            [cluster_stack.ops(c) for c in CONSUMERS],
            LiveNode(cluster, survivors[0]),  # type: ignore[arg-type]
        )
    assert {s for s in load.statuses if not 200 <= s < 300} == set(), load.refused[:5]
    figures(
        "rabbitmq_node_stopped",
        load,
        stored,
        accepted_before_stop=accepted_before,
        stopped_node=cluster.node(victim),
        connections_moved=len(moved),
        node_stop_s=f"{stopped - stopping:.1f}",
        all_reconnected_s=f"{reconnected - stopping:.1f}",
        regional_entries_checked=matched,
        global_entries_checked=merged,
        leaders_on_stopped_node=leaders_moved,
        queues=f"'{consumed(queues)}'",
    )
