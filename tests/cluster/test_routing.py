"""Ladder's Redis client on a Redis Cluster (shared/redis_cluster.py): function calls go where
their board's slot is without asking a node for their keys, the library comes back on a node
that lost it, calls follow a slot that moves, and boards spread over the primaries."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from shared.boards import Board
from shared.functions import LEASE_HOLD_FUNCTION, LIBRARY
from shared.keys import Keys
from shared.lease import Lease
from shared.redis import PackedConnection, library_source, open_redis
from shared.redis_cluster import seed_nodes
from shared.settings import LadderSettings
from tests.api.helpers import MAIN, add_board, get_ok, post, score
from tests.cluster.conftest import on
from tests.helpers import api_client
from tests.redis_cluster import HOST, PrivateCluster, free_cluster_ports
from tests.stack import wait_for

pytestmark = pytest.mark.cluster

BOARDS = [f"b{i}" for i in range(12)]


@pytest.fixture
async def redis(shared_cluster: PrivateCluster, keys: Keys) -> AsyncIterator[Redis]:
    """A cluster client with the library loaded; the test's keys removed afterwards."""
    async with open_redis(shared_cluster.url, load_functions=True, cluster=True) as client:
        yield client
        batch = [k async for k in client.scan_iter(match="{" + keys.prefix + ":*", count=1000)]
        batch += [k async for k in client.scan_iter(match=keys.prefix + ":*", count=1000)]
        if batch:
            await client.delete(*batch)


def calls(cluster: PrivateCluster, command: str) -> int:
    """Calls of ``command`` (``fcall``, ``command|getkeys``) so far, summed over the nodes."""
    total = 0
    for port in cluster.roles():
        with cluster.client(port) as client:
            stats: dict[str, Any] = client.info("commandstats")
            total += int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
    return total


def hold_args(keys: Keys, board_id: str, owner: str) -> tuple[Any, ...]:
    """The arguments of a merge lease's FCALL (shared/lease.py)."""
    lease, fence = keys.merge_lease(board_id), keys.merge_fence(board_id)
    return (LEASE_HOLD_FUNCTION, 2, lease, fence, owner, 60_000)


def primary_of(cluster: PrivateCluster, client: Redis, keys: Keys, board_id: str) -> int:
    return cluster.port_of_slot(client.keyslot(keys.tag(board_id)))  # type: ignore[attr-defined]


async def test_function_calls_ask_no_node_for_their_keys(
    shared_cluster: PrivateCluster, redis: Redis, keys: Keys
) -> None:
    getkeys, fcalls = calls(shared_cluster, "command|getkeys"), calls(shared_cluster, "fcall")
    lease = Lease(redis, keys, ttl=60)
    for board_id in BOARDS:
        assert await lease.hold(board_id)
        await lease.renew(board_id)
    async with redis.pipeline(transaction=False) as pipe:
        for board_id in BOARDS:
            pipe.fcall(*hold_args(keys, board_id, lease.owner))
        tokens = await pipe.execute()
    assert tokens == [lease.token(board_id) for board_id in BOARDS]
    # Each call reached a node once, and no node was asked for a call's keys.
    assert calls(shared_cluster, "fcall") == fcalls + 3 * len(BOARDS)
    assert calls(shared_cluster, "command|getkeys") == getkeys


async def test_the_library_is_loaded_again_on_a_primary_that_lost_it(
    shared_cluster: PrivateCluster, redis: Redis, keys: Keys
) -> None:
    lease = Lease(redis, keys, ttl=60)
    flushed = primary_of(shared_cluster, redis, keys, "b0")
    with shared_cluster.client(flushed) as node:
        node.function_flush()
        assert node.function_list() == []
    assert await lease.hold("b0")  # made again once the library is back
    with shared_cluster.client(flushed) as node:
        assert [library[1] for library in node.function_list()] == [LIBRARY]
        node.function_flush()
    # A pipeline: calls on the node without the library (made again), on another node, and a
    # plain command (made once).
    boards = [f"x{i}" for i in range(40)]
    there = next(b for b in boards if primary_of(shared_cluster, redis, keys, b) == flushed)
    elsewhere = next(b for b in boards if primary_of(shared_cluster, redis, keys, b) != flushed)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.fcall(*hold_args(keys, there, "x"))
        pipe.fcall(*hold_args(keys, elsewhere, "x"))
        pipe.incr(keys.merge_fence("b0"))
        pipe.fcall(*hold_args(keys, "b0", "y"))
        first, second, fence, taken = await pipe.execute()
    # b0's lease is held (by lease.owner): "y" is refused; the plain INCR ran once.
    assert (first, second, fence, taken) == ("1|x", "1|x", 2, "")
    with shared_cluster.client(flushed) as node:
        assert [library[1] for library in node.function_list()] == [LIBRARY]


async def test_a_call_missing_its_function_never_replaces_a_newer_library(
    shared_cluster: PrivateCluster, redis: Redis, keys: Keys
) -> None:
    """A rolling upgrade: a newer release loaded its library (same name, other function names)
    on a primary. An older process's call there fails, as on one Redis, and leaves the newer
    library in place; a primary with no library gets the process's own."""
    newer = f"#!lua name={LIBRARY}\nredis.register_function('ladder_newer_v99', function() end)"
    there = primary_of(shared_cluster, redis, keys, "b0")
    empty = next(p for p in shared_cluster.primaries() if p != there)
    with shared_cluster.client(there) as node, shared_cluster.client(empty) as other:
        node.function_load(newer, replace=True)
        other.function_flush()
    try:
        with pytest.raises(ResponseError, match=r"(?i)function not found"):
            await redis.fcall(*hold_args(keys, "b0", "old"))
        with shared_cluster.client(there) as node, shared_cluster.client(empty) as other:
            functions = node.function_list()[0]
            assert [f[1] for f in functions[5]] == ["ladder_newer_v99"], functions
            assert [library[1] for library in other.function_list()] == [LIBRARY]
    finally:
        await redis.function_load(library_source(), replace=True)  # every primary's, back


async def test_a_pipeline_sent_again_makes_no_answered_command_again(
    shared_cluster: PrivateCluster, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection to one primary lost as a pipeline is sent: redis-py sends the pipeline again
    for the commands without a reply. A PUBLISH answered 0 (no subscriber on its own node) on
    another primary is not published twice, nor a 0 reply made again."""
    first, second, third = shared_cluster.primaries()
    channel = next(c for c in (f"c{i}" for i in range(200)) if primary_of_key(redis, c) == second)
    counter = next(
        k
        for k in (f"{keys.tag(f'n{i}')}:n" for i in range(200))
        if primary_of_key(redis, k) == second
    )
    written = next(
        k
        for k in (f"{keys.tag(f'n{i}')}:n" for i in range(200))
        if primary_of_key(redis, k) == third
    )
    lost: list[int] = []
    send = PackedConnection.send_packed_command

    async def losing(self: PackedConnection, command: Any, check_health: bool = True) -> None:
        if self.port == third and not lost:
            lost.append(third)
            await asyncio.sleep(0.05)  # the other primary answers first
            raise RedisConnectionError("Connection lost as the pipeline was sent")
        await send(self, command, check_health)

    with shared_cluster.client(first) as node:
        listener = node.pubsub()
        listener.subscribe(channel)
        monkeypatch.setattr(PackedConnection, "send_packed_command", losing)
        async with redis.pipeline(transaction=False) as pipe:
            pipe.publish(channel, "once")
            pipe.decr(counter)  # 0, from 1
            pipe.incr(written)
            await redis.set(counter, "1")
            assert await pipe.execute() == [0, 0, 1]
        assert lost == [third]
        heard = []
        while (message := listener.get_message(timeout=0.5)) is not None:
            if message["type"] == "message":
                heard.append(message["data"])
        listener.close()
    assert heard == ["once"]
    assert await redis.get(counter) == "0"


def primary_of_key(client: Redis, key: str) -> int:
    return int(client.get_node_from_key(key).port)  # type: ignore[attr-defined]


def begin_move(cluster: PrivateCluster, slot: int) -> tuple[int, int]:
    """Mark ``slot`` as moving from its primary to another, as redis-cli's resharding begins:
    the ports of the two."""
    source = cluster.port_of_slot(slot)
    target = next(port for port in cluster.primaries() if port != source)
    source_id, target_id = cluster.node_id(source), cluster.node_id(target)
    with cluster.client(source) as src, cluster.client(target) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    return source, target


async def move_slot(cluster: PrivateCluster, slot: int, pause: float) -> int:
    """Move ``slot`` to another primary as redis-cli's resharding does, a key at a time with
    ``pause`` between keys (calls meanwhile meet ASK and TRYAGAIN); the new owner's port."""
    source, target = begin_move(cluster, slot)
    with cluster.client(source) as src:
        while names := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *names)
            await asyncio.sleep(pause)
    for port in cluster.primaries():
        with cluster.client(port) as node:
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", cluster.node_id(target))
    return target


async def test_a_write_sent_again_on_an_ask_is_not_covered_by_its_wait(
    shared_cluster: PrivateCluster, redis: Redis, keys: Keys
) -> None:
    """A slot half moved: a pipelined write of a key that has moved meets ASK and is sent
    again on its own, after the WAIT on the first node ran; that WAIT does not speak for it
    (services/api/write/durable.py answers such writes 503, and their retries confirm). A
    write of a key still in place is covered."""
    tag = keys.tag("asking")
    slot = redis.keyslot(tag)  # type: ignore[attr-defined]
    moved, staying = f"{tag}:moved", f"{tag}:staying"
    await redis.set(moved, "0")
    await redis.set(staying, "0")
    source, target = begin_move(shared_cluster, slot)
    with shared_cluster.client(source) as src:
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", moved)
    try:
        covered = []
        for key in (moved, staying):
            async with redis.pipeline(transaction=False) as pipe:
                pipe.set(key, "1")
                await pipe.queue_waits(1, 2000)  # type: ignore[attr-defined]
                replies = await pipe.execute(raise_on_error=False)
                covered.append(pipe.waits_cover())  # type: ignore[attr-defined]
            assert replies[0] is True, replies
        assert covered == [False, True]
        assert await redis.get(moved) == "1" and await redis.get(staying) == "1"
    finally:
        await move_slot(shared_cluster, slot, 0)


def add_primary(cluster: PrivateCluster) -> int:
    """A primary joined empty, as ``redis-cli --cluster add-node`` adds one: no slot, no
    library; its port."""
    (port,) = free_cluster_ports(1)
    cluster.ports.append(port)
    cluster.start_node(port)
    wait_for(f"redis-server on {port}", lambda: cluster.answers(port), 60, 0.2)
    subprocess.run(
        ["redis-cli", "--cluster", "add-node", f"{HOST}:{port}", f"{HOST}:{cluster.ports[0]}"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    wait_for(f"the cluster to be ok on {port}", lambda: _ok(cluster, port), 60, 0.2)
    return port


def _ok(cluster: PrivateCluster, port: int) -> bool:
    with cluster.client(port) as client:
        return client.execute_command("CLUSTER INFO").get("cluster_state") == "ok"


async def test_calls_follow_a_slot_moving_onto_a_primary_that_joined_empty(
    own_cluster: PrivateCluster, keys: Keys
) -> None:
    """A resharding onto a primary just added: the board's keys that have moved answer ASK
    with a node the client's slot map does not list (it serves no slot yet) and that has no
    library. A call follows the ASK there, the library is loaded on it, and the call made."""
    async with open_redis(own_cluster.url, load_functions=True, cluster=True) as redis:
        lease = Lease(redis, keys, ttl=60)
        assert await lease.hold("joining")
        slot = redis.keyslot(keys.tag("joining"))  # type: ignore[attr-defined]
        target = add_primary(own_cluster)
        source = own_cluster.port_of_slot(slot)
        with own_cluster.client(source) as src, own_cluster.client(target) as dst:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", own_cluster.node_id(source))
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", own_cluster.node_id(target))
            moving = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 10)
            assert sorted(moving) == [keys.merge_fence("joining"), keys.merge_lease("joining")]
            src.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *moving)
        await lease.renew("joining")  # ASK, then the library loaded there
        async with redis.pipeline(transaction=False) as pipe:
            pipe.fcall(*hold_args(keys, "joining", lease.owner))
            assert await pipe.execute() == [lease.token("joining")]
        with own_cluster.client(target) as node:
            assert [library[1] for library in node.function_list()] == [LIBRARY]
            assert node.execute_command("DBSIZE") == 2


async def test_writes_and_reads_follow_a_slot_that_moves(
    shared_cluster: PrivateCluster, redis: Redis, keys: Keys, quiet: LadderSettings
) -> None:
    await add_board(redis, keys, Board.model_validate({**MAIN, "board_id": "moving"}))
    slot = redis.keyslot(keys.tag("moving"))  # type: ignore[attr-defined]
    accepted: list[int] = []
    async with api_client(on(shared_cluster, quiet)) as client:
        for value in range(20):  # keys to move: the views, the outbox, the records
            await post(client, score(user_id=f"u-{value}", value=1), board="moving")
            accepted.append(1)

        async def write() -> None:
            n = 0
            while not moved.done():
                await post(client, score(user_id=f"u-{n % 20}", value=1), board="moving")
                accepted.append(1)
                n += 1

        moved = asyncio.ensure_future(move_slot(shared_cluster, slot, 0.01))
        await asyncio.gather(write(), moved)
        assert shared_cluster.port_of_slot(slot) == moved.result()
        await post(client, score(user_id="u-0", value=1), board="moving")
        accepted.append(1)
        stats = await get_ok(client, "/v1/boards/moving/stats", period="alltime")
    # Every accepted event is in the board's outbox once, wherever its slot went.
    assert await redis.xlen(keys.outbox("moving")) == len(accepted) > 20
    assert stats["board_id"] == "moving"


async def test_twelve_boards_spread_their_keys_over_the_primaries(
    shared_cluster: PrivateCluster, redis: Redis, keys: Keys, quiet: LadderSettings
) -> None:
    for board_id in BOARDS:
        await add_board(redis, keys, Board.model_validate({**MAIN, "board_id": board_id}))
    async with api_client(on(shared_cluster, quiet)) as client:
        for board_id in BOARDS:
            await post(client, score(value=3), board=board_id)
            assert await redis.xlen(keys.outbox(board_id)) == 1
    holding = {}
    for port in shared_cluster.primaries():
        with shared_cluster.client(port) as node:
            found = {key.split("}")[0] for key in node.scan_iter(match="{" + keys.prefix + ":b*")}
            holding[port] = len(found)
    assert sum(holding.values()) == len(BOARDS)
    assert len([n for n in holding.values() if n]) >= 2, holding


async def test_a_node_list_opens_the_cluster_with_its_first_node_down(
    shared_cluster: PrivateCluster, keys: Keys
) -> None:
    """LADDER_REDIS_URL naming several nodes: a process that starts while the first is away
    finds the cluster through the next one (a port nothing listens on stands for it)."""
    free = free_cluster_ports(1)[0]
    nodes = [f"redis://127.0.0.1:{free}/0", shared_cluster.url]
    async with open_redis(",".join(nodes), load_functions=True, cluster=True) as client:
        key = keys.tag("nodes") + ":probe"
        await client.set(key, "1", ex=60)
        assert await client.get(key) == "1"
        known = {int(node.port) for node in client.get_nodes()}  # type: ignore[attr-defined]
        assert set(shared_cluster.primaries()) <= known


def test_a_node_list_is_refused_without_the_cluster_setting() -> None:
    nodes = "redis://127.0.0.1:7000/0,redis://127.0.0.1:7001/0"
    with pytest.raises(ValidationError, match="LADDER_REDIS_CLUSTER=true"):
        LadderSettings(_env_file=None, redis_url=nodes)  # type: ignore[call-arg]
    assert LadderSettings(_env_file=None, redis_url=nodes, redis_cluster=True).redis_cluster  # type: ignore[call-arg]


def test_a_node_list_entry_needs_a_host_and_a_port() -> None:
    first, others = seed_nodes(" redis://127.0.0.1:7000/0 , redis://127.0.0.1:7001/0 ")
    assert first == "redis://127.0.0.1:7000/0"
    assert [(node.host, node.port) for node in others] == [("127.0.0.1", 7001)]
    with pytest.raises(ValueError, match="host and a port"):
        seed_nodes("redis://127.0.0.1:7000/0,redis://127.0.0.1/0")
