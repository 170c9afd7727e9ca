"""Pushes over the WebSocket (docs/api.md section 9): a lost Pub/Sub connection, and clients too
slow to keep up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import websockets
from prometheus_client import REGISTRY
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import PubSub
from websockets.exceptions import ConnectionClosed

from services.api.push import hub
from services.api.push import ws as push
from services.api.serving import uvicorn_server as server
from shared.keys import Keys
from shared.redis_cluster import LadderCluster
from shared.settings import DEV_SERVER_KEY, LadderSettings
from shared.topology import Topology
from tests.helpers import eventually, production_server, serve, until_pong

pytestmark = pytest.mark.usefixtures("mysql_database")

TOKEN = f"token={DEV_SERVER_KEY}"


async def subscribe(ws: websockets.ClientConnection, topic: str) -> None:
    """Subscribe and wait until the server has done it."""
    answers = await until_pong(ws, {"op": "subscribe", "topic": topic})
    assert all(answer["type"] != "error" for answer in answers), answers


async def next_message(ws: websockets.ClientConnection, within: float) -> dict[str, Any]:
    async with asyncio.timeout(within):
        message: dict[str, Any] = json.loads(await ws.recv())
        return message


async def hub_connections(redis: Redis, name: str) -> list[dict[str, str]]:
    """The Pub/Sub connections of the hub named ``name``, as ``CLIENT LIST`` shows them on every
    node (one Redis, or each node of a cluster: the hub listens on any one), with the node's
    ``node`` field for ``kill_connection``."""
    found = []
    for node in redis.get_nodes() if isinstance(redis, RedisCluster) else [None]:
        target = {} if node is None else {"target_nodes": node}
        listed = await redis.execute_command("CLIENT LIST TYPE pubsub", **target)
        for line in listed.splitlines():
            fields = dict(item.split("=", 1) for item in line.split(" ") if "=" in item)
            if fields.get("name") == name:
                found.append(fields | {"node": "" if node is None else node.name})
    return found


async def kill_connection(redis: Redis, connection: dict[str, str]) -> None:
    """``CLIENT KILL`` a connection ``hub_connections`` found, on its node."""
    target = {}
    if isinstance(redis, RedisCluster):
        target["target_nodes"] = redis.get_node(node_name=connection["node"])
    await redis.execute_command("CLIENT KILL ID", connection["id"], **target)


async def test_a_killed_pubsub_connection_resyncs_every_client(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    channel = Keys(quiet.key_prefix).user_channel("u-1")
    name = f"ladder-hub-{quiet.key_prefix}"
    async with serve(quiet) as url, websockets.connect(f"{url}?{TOKEN}") as ws:
        await subscribe(ws, "user:u-1")
        await redis.publish(channel, json.dumps({"type": "badge", "n": 0}))
        assert (await next_message(ws, 5))["n"] == 0

        # Only this test's hub connection: other tests' Pub/Sub connections live on.
        [before] = await hub_connections(redis, name)
        assert before["sub"] == "1"
        killed_at = time.monotonic()
        await kill_connection(redis, before)

        assert await next_message(ws, 5) == {"type": "resync"}
        resynced_at = time.monotonic()
        # Published once, right after the resync: the hub subscribed again before telling.
        await redis.publish(channel, json.dumps({"type": "badge", "n": 1}))
        assert (await next_message(ws, 5))["n"] == 1
        arrived_at = time.monotonic()
        [after] = await hub_connections(redis, name)
        assert after["id"] != before["id"] and after["sub"] == "1"
    print(
        f"\nFIGURES pubsub_killed: resync after {resynced_at - killed_at:.3f} s, "
        f"the next push {(arrived_at - resynced_at) * 1000:.1f} ms after the resync, "
        f"{arrived_at - killed_at:.3f} s after the kill"
    )
    # Pushes resume within 5 s of losing the connection.
    assert arrived_at - killed_at < 5.0


class FreezingProxy:
    """A TCP proxy to Redis whose connections can be frozen: from then on no byte passes either
    way and nothing is closed, as when a peer or the network vanishes without a reset.
    Connections made after a freeze flow again."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.frozen: set[asyncio.StreamWriter] = set()
        self.live: set[asyncio.StreamWriter] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[int]:
        listener = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        try:
            yield listener.sockets[0].getsockname()[1]
        finally:
            listener.close()
            for writer in self.live:
                writer.close()

    def freeze(self) -> None:
        self.frozen |= self.live

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.live |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer, writer),
            self._pipe(up_reader, writer, writer),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            w.close()

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, client: asyncio.StreamWriter
    ) -> None:
        while data := await source.read(65536):
            if client in self.frozen:
                continue
            sink.write(data)
            await sink.drain()


async def test_a_silent_pubsub_connection_is_noticed_and_resyncs(
    quiet: LadderSettings, redis: Redis, broker: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "PING_AFTER", 0.5)
    monkeypatch.setattr(hub, "PONG_WITHIN", 0.5)
    channel = Keys(quiet.key_prefix).user_channel("u-1")
    if isinstance(redis, RedisCluster):
        # The hub listens on one node, whatever the others: it is given the proxied node only.
        node = redis.get_primaries()[0]
        proxy = FreezingProxy(node.host, node.port)
    else:
        target = redis.connection_pool.connection_kwargs
        proxy = FreezingProxy(target["host"], target["port"])
    async with proxy.running() as port:
        proxied_url = f"redis://127.0.0.1:{port}/0"
        if isinstance(redis, RedisCluster):
            # The API's cluster client reaches the nodes as ever; its hub, the proxy alone.
            monkeypatch.setattr(LadderCluster, "node_urls", lambda self, url: [proxied_url])
            proxied = quiet
        else:
            proxied = quiet.model_copy(update={"redis_url": proxied_url})
        async with serve(proxied) as url, websockets.connect(f"{url}?{TOKEN}") as ws:
            await subscribe(ws, "user:u-1")
            proxy.freeze()
            frozen_at = time.monotonic()
            # Nothing arrives through the frozen connection, and redis-py raises nothing.
            await redis.publish(channel, json.dumps({"type": "badge", "n": 0}))
            assert await next_message(ws, 5) == {"type": "resync"}
            resynced_at = time.monotonic()
            await redis.publish(channel, json.dumps({"type": "badge", "n": 1}))
            assert (await next_message(ws, 5))["n"] == 1
            arrived_at = time.monotonic()
    print(
        f"\nfrozen hub connection: resync after {resynced_at - frozen_at:.3f} s, "
        f"the next push {(arrived_at - resynced_at) * 1000:.1f} ms after the resync"
    )


async def connect_unread(url: str) -> websockets.ClientConnection:
    """A client that will not read: a small receive buffer, and a library queue of two."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    port = int(url.split(":")[2].split("/")[0])
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await websockets.connect(url, sock=sock, max_queue=2, compression=None)


async def until(condition: Callable[[], bool], within: float) -> None:
    async def probe() -> bool | None:
        return condition() or None

    await eventually(probe, within)


def open_sockets() -> float:
    return REGISTRY.get_sample_value("ladder_ws_connections") or 0.0


MESSAGES = 2000


async def publish_all(redis: Redis, channel: str) -> None:
    # Random text, 20 KB a message: compression would otherwise shrink it to nothing.
    for i in range(MESSAGES):
        await redis.publish(
            channel, json.dumps({"type": "rank", "i": i, "pad": secrets.token_hex(10_000)})
        )


async def read_all(ws: websockets.ClientConnection, arrivals: list[float]) -> None:
    """Every message's arrival time into ``arrivals``, checking that they come in order."""
    async with asyncio.timeout(60):
        for i in range(MESSAGES):
            assert json.loads(await ws.recv())["i"] == i
            arrivals.append(time.monotonic())


def watch_overflow(monkeypatch: pytest.MonkeyPatch, arrivals: list[float]) -> list[int]:
    """Filled in when a socket's send queue first overflows (the server finds its client too
    slow): the index of the message that overflowed it, and how many ``arrivals``' reader had
    received by then."""
    deliver, seen = push.Client.deliver, []

    def watched(client: push.Client, text: str, channel: str = "") -> None:
        deliver(client, text, channel)
        if client.too_slow.is_set() and not seen:
            seen.extend([json.loads(text)["i"], len(arrivals)])

    monkeypatch.setattr(push.Client, "deliver", watched)
    return seen


async def test_a_slow_client_is_cut_off_and_the_fast_one_gets_everything(
    quiet: LadderSettings, redis: Redis, broker: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = Keys(quiet.key_prefix).user_channel("u-1")
    arrivals: list[float] = []
    overflow = watch_overflow(monkeypatch, arrivals)
    async with production_server(quiet) as (_, url):
        base = open_sockets()
        slow = await connect_unread(f"{url}?{TOKEN}")
        fast = await websockets.connect(f"{url}?{TOKEN}", compression=None, max_size=None)
        await subscribe(slow, "user:u-1")
        await subscribe(fast, "user:u-1")
        assert open_sockets() == base + 2

        started = time.monotonic()
        reader = asyncio.create_task(read_all(fast, arrivals))
        publisher = asyncio.create_task(publish_all(redis, channel))
        # The server lets go of the slow client (its queue filled) while publishing goes on.
        await until(lambda: open_sockets() == base + 1, within=60)
        cut_at = time.monotonic()
        # Reading now, it finds what was sent before the cut, then the close frame.
        got = 0
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(10):
                while True:
                    assert json.loads(await slow.recv())["i"] == got
                    got += 1
        assert (slow.close_code, slow.close_reason) == (1013, "too slow to keep up")
        await publisher
        published_at = time.monotonic()
        await reader
        assert fast.close_code is None
        await fast.close()
    print(
        f"\n{MESSAGES} messages of 20 KB: the slow client was cut off "
        f"{cut_at - started:.2f} s in; it read the {got} sent before the cut, then 1013; "
        f"the fast client got all {len(arrivals)} in {arrivals[-1] - started:.2f} s, "
        f"the last {(arrivals[-1] - published_at) * 1000:.0f} ms after the last publish; "
        f"message {overflow[0]} overflowed the slow one's queue, the fast one had {overflow[1]}"
    )
    assert got < MESSAGES
    # The slow client took ``got`` messages, then its queue of ws_send_queue filled while it was
    # stuck: meanwhile the fast one kept receiving, all but a few of those messages in hand
    # when the last of them overflowed the slow one's queue.
    index, fast_had = overflow
    assert index > got and fast_had >= index - quiet.ws_send_queue // 4, (overflow, got)


async def test_a_burst_past_the_send_queue_reaches_a_client_that_reads(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    """A batch's rank messages come from one call of the notifier, back to back on the hub's
    connection: more of them than a socket's send queue holds (256) reach a client that reads
    as they come. The hub put all of them in the queue before the socket's sender ran once, and
    the client was closed with 1013 after 256."""
    channel = Keys(quiet.key_prefix).user_channel("u-1")
    burst = 3 * quiet.ws_send_queue
    async with (
        production_server(quiet) as (_, url),
        websockets.connect(f"{url}?{TOKEN}", compression=None) as ws,
    ):
        await subscribe(ws, "user:u-1")
        async with redis.pipeline(transaction=True) as pipe:
            for i in range(burst):
                pipe.publish(channel, json.dumps({"type": "rank", "i": i}))
            await pipe.execute()
        got = [(await next_message(ws, within=10))["i"] for _ in range(burst)]
        assert ws.close_code is None
    assert got == list(range(burst))


async def test_a_client_that_never_reads_is_dropped(
    quiet: LadderSettings, redis: Redis, broker: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "CLOSE_TIMEOUT", 1.0)
    channel = Keys(quiet.key_prefix).user_channel("u-1")
    async with production_server(quiet) as (api, url):
        base = open_sockets()
        slow = await connect_unread(f"{url}?{TOKEN}")
        await subscribe(slow, "user:u-1")
        publisher = asyncio.create_task(publish_all(redis, channel))
        await until(lambda: open_sockets() == base, within=60)
        cut_at = time.monotonic()
        # The close frame cannot reach a client that reads nothing; the server drops the
        # connection once the close has gone unanswered for CLOSE_TIMEOUT.
        await until(lambda: not api.server_state.connections, within=10)
        dropped_at = time.monotonic()
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(10):
                while True:
                    await slow.recv()
        assert slow.close_code == 1006  # no close frame: the connection was reset
        await publisher
    print(
        f"\nthe client that never read: dropped {dropped_at - cut_at:.2f} s after the cut-off "
        f"(close timeout 1 s); it saw close code {slow.close_code}"
    )


async def test_a_quiet_healthy_pubsub_connection_is_kept(
    quiet: LadderSettings, redis: Redis, broker: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pings on a connection with nothing to carry are answered: no reconnect, no resync, and
    nothing published meanwhile is lost."""
    # A ping after 0.2 s without traffic, given up 1 s later unanswered: over 3 s of quiet a
    # hub that missed its pongs would remake the connection twice, while an answer is only ever
    # a round trip away.
    monkeypatch.setattr(hub, "PING_AFTER", 0.2)
    monkeypatch.setattr(hub, "PONG_WITHIN", 1.0)
    pings, ping = [], PubSub.ping

    def counted(pubsub: PubSub, message: Any = None) -> Any:
        if message == hub.PING_MESSAGE:
            pings.append(message)
        return ping(pubsub, message)

    monkeypatch.setattr(PubSub, "ping", counted)
    channel = Keys(quiet.key_prefix).user_channel("u-1")
    reconnects = REGISTRY.get_sample_value("ladder_ws_pubsub_reconnects_total") or 0.0
    async with serve(quiet) as url, websockets.connect(f"{url}?{TOKEN}") as ws:
        await subscribe(ws, "user:u-1")
        quiet_for = 3.0
        with pytest.raises(TimeoutError):
            await next_message(ws, quiet_for)
        await redis.publish(channel, json.dumps({"type": "badge", "n": 1}))
        assert (await next_message(ws, 5))["n"] == 1
    after = REGISTRY.get_sample_value("ladder_ws_pubsub_reconnects_total") or 0.0
    print(
        f"\nquiet hub connection: {quiet_for} s idle, {len(pings)} pings, "
        f"reconnects {after - reconnects:.0f}"
    )
    # The hub pings again only once the last ping was answered: pings were sent and answered.
    assert len(pings) >= 3
    assert after == reconnects
