"""How many sockets the WebSocket lets in, and what the Pub/Sub hub's bookkeeping costs
(docs/api.md section 9, docs/security.md "WebSocket floods")."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from typing import Any

import pytest
import websockets
from redis.asyncio import Redis
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.exceptions import InvalidStatus

from services.api.push.admission import LEASE_SECONDS, SocketSlots, TooManySockets
from services.api.push.hub import Hub
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.api.test_pubsub import hub_connections
from tests.api.test_ws_security import TOPIC, ask, close_code
from tests.helpers import eventually, production_server, serve


def forwarded(address: str) -> dict[str, str]:
    """What a proxy in front of the API (one of LADDER_FORWARDED_ALLOW_IPS; the tests connect
    from 127.0.0.1, which is) says of the client it passes on."""
    return {"X-Forwarded-For": address}


async def refusal(url: str, **kwargs: Any) -> InvalidStatus:
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(url, **kwargs):
            pass
    return refused.value


async def admitted_soon(
    stack: contextlib.AsyncExitStack, url: str, sockets: list[websockets.ClientConnection]
) -> None:
    """A new socket to ``url`` is let in within 5 s (a slot given back meanwhile), and kept
    open in ``sockets`` until ``stack`` ends."""

    async def admitted() -> bool:
        try:
            sockets.append(await stack.enter_async_context(websockets.connect(url)))
        except InvalidStatus:
            return False
        return True

    await eventually(admitted, within=5)


async def all_alive(sockets: list[websockets.ClientConnection], channel: str, redis: Redis) -> None:
    """Every socket, subscribed to ``TOPIC``, receives a push and answers a ping."""
    published = {"type": "leaderboard", "probe": time.monotonic()}
    await redis.publish(channel, json.dumps(published))

    async def check(ws: websockets.ClientConnection) -> None:
        async with asyncio.timeout(10):
            assert json.loads(await ws.recv()) == published
            await ws.send(json.dumps({"op": "ping"}))
            assert json.loads(await ws.recv()) == {"type": "pong"}

    await asyncio.gather(*(check(ws) for ws in sockets))


def test_the_caps_default_to_200_an_address_and_20000_a_process() -> None:
    defaults = LadderSettings(_env_file=None)  # type: ignore[call-arg]
    assert (defaults.ws_max_per_ip, defaults.ws_max) == (200, 20_000)


@pytest.mark.usefixtures("mysql_database")
async def test_the_201st_socket_from_one_address_is_refused(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    assert quiet.ws_max_per_ip == 200  # the default, as deployed
    channel = Keys(quiet.key_prefix).board_channel("main", "global", "weekly")
    async with production_server(quiet) as (_, url), contextlib.AsyncExitStack() as stack:
        sockets = [await stack.enter_async_context(websockets.connect(url)) for _ in range(200)]
        answers = await asyncio.gather(
            *(ask(ws, {"op": "subscribe", "topic": TOPIC}) for ws in sockets)
        )
        assert {a["type"] for a in answers} == {"ok"}, [a for a in answers if a["type"] != "ok"][:3]

        refused = await refusal(url)
        assert refused.response.status_code == 429
        assert int(refused.response.headers["Retry-After"]) >= 1
        problem = json.loads(refused.response.body)
        assert problem["status"] == 429 and "LADDER_WS_MAX_PER_IP" in problem["detail"]
        # The 200 live on: each still gets pushes and answers pings after the refusal.
        await all_alive(sockets, channel, redis)
        # Another address is let in meanwhile.
        async with websockets.connect(url, additional_headers=forwarded("203.0.113.7")) as other:
            assert (await ask(other, {"op": "ping"}))["type"] == "ok"

        # A socket that goes gives its slot back.
        await sockets.pop().close()

        await admitted_soon(stack, url, sockets)
        assert (await refusal(url)).response.status_code == 429


@pytest.mark.usefixtures("mysql_database")
async def test_the_address_cap_holds_across_api_processes(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    # Two API processes on one Redis, as `make up`'s workers are: three sockets an address in
    # all, wherever they land.
    capped = quiet.model_copy(update={"ws_max_per_ip": 3})
    async with (
        production_server(capped) as (_, one),
        production_server(capped) as (_, two),
        contextlib.AsyncExitStack() as stack,
    ):
        held = [await stack.enter_async_context(websockets.connect(one)) for _ in range(2)]
        held.append(await stack.enter_async_context(websockets.connect(two)))
        for url in (one, two):
            refused = await refusal(url)
            assert refused.response.status_code == 429
            assert "LADDER_WS_MAX_PER_IP" in json.loads(refused.response.body)["detail"]
        # A socket closed on one process frees a slot on the other.
        await held.pop(0).close()

        await admitted_soon(stack, two, held)
        assert (await refusal(one)).response.status_code == 429


async def test_the_sockets_of_a_process_gone_stop_counting_when_their_leases_end(
    quiet: LadderSettings, redis: Redis
) -> None:
    keys, address = Keys(quiet.key_prefix), "203.0.113.9"
    key = keys.ws_address(address)
    # A process that died without giving its slots back: one lease over, one still running.
    await redis.zadd(key, {"gone-1": time.time() - 1, "gone-2": time.time() + 30})
    slots = SocketSlots(10, 2, redis, keys)
    async with slots.held(address):
        assert await redis.zscore(key, "gone-1") is None  # pruned as the handshake counted
        with pytest.raises(TooManySockets):
            async with slots.held(address):
                pass
        # A renewal extends this process's leases only: its own, a second from its end, runs
        # a whole lease again from the renewal.
        before = dict(await redis.zrange(key, 0, -1, withscores=True))
        mine = next(name for name in before if not name.startswith("gone"))
        await redis.zadd(key, {mine: time.time() + 1})
        renewed_at = time.time()
        await slots.renew()
        after = dict(await redis.zrange(key, 0, -1, withscores=True))
        assert after["gone-2"] == before["gone-2"]
        assert abs(after[mine] - (renewed_at + LEASE_SECONDS)) < 1.0, after[mine] - renewed_at
    assert await redis.zrange(key, 0, -1) == ["gone-2"]  # its own slot given back


async def test_a_renewal_counts_again_the_sockets_the_shared_count_lost(
    quiet: LadderSettings, redis: Redis
) -> None:
    # The address's set gone (a Redis restarted, or out of reach past a lease): the sockets
    # still open must count again, or the address could open the cap's worth more.
    keys, address = Keys(quiet.key_prefix), "203.0.113.10"
    slots = SocketSlots(10, 2, redis, keys)
    async with slots.held(address), slots.held(address):
        await redis.delete(keys.ws_address(address))
        await slots.renew()
        assert await redis.zcard(keys.ws_address(address)) == 2
        with pytest.raises(TooManySockets):
            async with slots.held(address):
                pass
    assert await redis.zcard(keys.ws_address(address)) == 0


async def test_a_burst_of_handshakes_never_passes_the_caps(
    quiet: LadderSettings, redis: Redis
) -> None:
    # Twenty handshakes at once, each awaiting the shared count in Redis: the process cap (3)
    # and the address cap (5) hold for the burst as they do one handshake at a time.
    keys = Keys(quiet.key_prefix)
    slots = SocketSlots(3, 5, redis, keys)
    admitted, release = [], asyncio.Event()

    async def handshake(i: int) -> None:
        with contextlib.suppress(TooManySockets):
            async with slots.held(f"198.51.100.{i % 2}"):
                admitted.append(i)
                await release.wait()

    tasks = [asyncio.create_task(handshake(i)) for i in range(20)]

    async def refused_the_rest() -> bool:
        return sum(task.done() for task in tasks) == 17

    await eventually(refused_the_rest, within=5)
    assert len(admitted) == 3 and slots.open == 3
    release.set()
    await asyncio.gather(*tasks)
    assert slots.open == 0
    for address in ("198.51.100.0", "198.51.100.1"):
        assert await redis.zcard(keys.ws_address(address)) == 0


@pytest.mark.usefixtures("mysql_database")
async def test_past_the_process_cap_every_address_is_refused(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    capped = quiet.model_copy(update={"ws_max": 5})
    channel = Keys(quiet.key_prefix).board_channel("main", "global", "weekly")
    async with production_server(capped) as (_, url), contextlib.AsyncExitStack() as stack:
        sockets = [
            await stack.enter_async_context(
                websockets.connect(url, additional_headers=forwarded(f"198.51.100.{i}"))
            )
            for i in range(5)
        ]
        for ws in sockets:
            assert (await ask(ws, {"op": "subscribe", "topic": TOPIC}))["type"] == "ok"
        refused = await refusal(url, additional_headers=forwarded("198.51.100.99"))
        assert refused.response.status_code == 429
        assert "LADDER_WS_MAX_PER_IP" not in json.loads(refused.response.body)["detail"]
        await all_alive(sockets, channel, redis)


@pytest.mark.usefixtures("mysql_database")
async def test_an_untrusted_peer_cannot_name_another_address(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    # No proxy is trusted: X-Forwarded-For is the client's own claim and changes nothing.
    direct = quiet.model_copy(update={"ws_max_per_ip": 3, "forwarded_allow_ips": []})
    async with production_server(direct) as (_, url), contextlib.AsyncExitStack() as stack:
        for i in range(3):
            await stack.enter_async_context(
                websockets.connect(url, additional_headers=forwarded(f"192.0.2.{i}"))
            )
        refused = await refusal(url, additional_headers=forwarded("192.0.2.200"))
        assert refused.response.status_code == 429


@pytest.mark.usefixtures("mysql_database")
async def test_a_server_without_http_refusals_closes_with_1013(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    capped = quiet.model_copy(update={"ws_max_per_ip": 1})
    async with serve(capped, without_http_refusals) as url, websockets.connect(url) as first:
        code, reason = await close_code(url)
        assert code == 1013 and "LADDER_WS_MAX_PER_IP" in reason
        assert (await ask(first, {"op": "ping"}))["type"] == "ok"


def without_http_refusals(app: ASGIApp) -> ASGIApp:
    """``app`` as a server that cannot answer a WebSocket handshake over HTTP sees it (every
    uvicorn protocol can: the ASGI ``websocket.http.response`` extension is taken out)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            scope = {**scope, "extensions": {}}
        await app(scope, receive, send)

    return wrapped


class Listener:
    """A subscriber of the hub, as a socket is."""

    def __init__(self) -> None:
        self.received: list[str] = []

    def deliver(self, text: str, channel: str = "") -> None:
        self.received.append(text)


async def test_forgetting_sockets_costs_time_linear_in_their_number(
    settings: LadderSettings, redis: Redis
) -> None:
    """A mass disconnect: forgetting 4N sockets takes about four times as long as forgetting N
    (a scan of every channel per socket, as before, made it sixteen), and leaves the hub and
    its Redis connection holding nothing."""
    name = f"ladder-hub-{settings.key_prefix}"
    hub = Hub(settings.redis_url, name)
    runner = asyncio.create_task(hub.run())
    per_socket = 4

    async def forget_all(count: int, round_: int) -> float:
        listeners = [Listener() for _ in range(count)]
        await asyncio.gather(
            *(
                hub.subscribe(f"{settings.key_prefix}:hub:{round_}:{i}:{j}", listener, wait=30)
                for i, listener in enumerate(listeners)
                for j in range(per_socket)
            )
        )
        assert (hub.subscribers, hub.channels) == (count, count * per_socket)
        # The collector's passes grow with the heap, not with the hub's work: kept out.
        gc.disable()
        try:
            # CPU time of this thread: the machine's other processes taking turns on the cores
            # lengthen a longer run's wall time more than a shorter one's.
            started = time.thread_time()
            for listener in listeners:
                hub.forget(listener)
            took = time.thread_time() - started
        finally:
            gc.enable()
        assert (hub.subscribers, hub.channels) == (0, 0)
        # Redis is told: the hub's connection ends up subscribed to nothing.
        await eventually(
            lambda: _subscribed_to_none(redis, name),
            within=10,
        )
        return took

    try:
        await eventually(lambda: _connected(hub), within=10)
        small, large = 1500, 6000
        # The fastest of three.
        few = min([await forget_all(small, r) for r in range(3)])
        many = min([await forget_all(large, 10 + r) for r in range(3)])
    finally:
        hub.stop()
        await asyncio.wait_for(runner, 10)
    ratio = many / few
    print(
        f"\nFIGURES hub_forget: {small} sockets {few * 1000:.1f} ms, {large} sockets "
        f"{many * 1000:.1f} ms, ratio {ratio:.1f} (linear 4, quadratic 16)"
    )
    assert ratio < 8


async def _connected(hub: Hub) -> bool:
    return hub.connected


async def _subscribed_to_none(redis: Redis, name: str) -> bool:
    # A connection subscribed to nothing leaves Redis's pubsub type altogether.
    return all(found["sub"] == "0" for found in await hub_connections(redis, name))


async def test_one_subscribe_and_unsubscribe_touch_only_their_channel(
    settings: LadderSettings, redis: Redis
) -> None:
    """With many channels held, a socket's subscribe and unsubscribe change Redis's
    subscriptions by exactly that channel, and pushes on the others keep flowing."""
    name = f"ladder-hub-{settings.key_prefix}"
    hub = Hub(settings.redis_url, name)
    runner = asyncio.create_task(hub.run())
    try:
        await eventually(lambda: _connected(hub), within=10)
        crowd = [Listener() for _ in range(500)]
        channels = [f"{settings.key_prefix}:hub:{i}" for i in range(len(crowd))]
        await asyncio.gather(*(hub.subscribe(c, s) for c, s in zip(channels, crowd, strict=True)))
        one, extra = Listener(), f"{settings.key_prefix}:hub:extra"
        await hub.subscribe(extra, one)
        [held] = await hub_connections(redis, name)
        assert held["sub"] == str(len(crowd) + 1)
        hub.forget(one)

        async def unsubscribed() -> bool:
            [now] = await hub_connections(redis, name)
            return now["sub"] == str(len(crowd))

        await eventually(unsubscribed, within=5)
        assert (hub.subscribers, hub.channels) == (len(crowd), len(crowd))
        await redis.publish(channels[7], "seven")
        await eventually(lambda: _received(crowd[7], "seven"), within=5)
        assert all(not s.received for i, s in enumerate(crowd) if i != 7)
    finally:
        hub.stop()
        await asyncio.wait_for(runner, 10)


async def _received(listener: Listener, text: str) -> bool:
    return text in listener.received


async def test_a_channel_left_and_wanted_again_at_once_keeps_its_pushes(
    settings: LadderSettings, redis: Redis
) -> None:
    """Sockets leave a channel and others take it up again at varying moments of the hub's
    turns (before, during and after the reconcile that would unsubscribe it): the channel ends
    up subscribed and pushed to."""
    name = f"ladder-hub-{settings.key_prefix}"
    channel = f"{settings.key_prefix}:hub:churn"
    hub = Hub(settings.redis_url, name)
    runner = asyncio.create_task(hub.run())
    try:
        await eventually(lambda: _connected(hub), within=10)
        current = Listener()
        await hub.subscribe(channel, current)
        for turn in range(200):
            hub.forget(current)
            # Let the hub's loop run a little, a different amount each time.
            for _ in range(turn % 7):
                await asyncio.sleep(0.001 * (turn % 3))
            current = Listener()
            await hub.subscribe(channel, current)
        await redis.publish(channel, "still here")
        await eventually(lambda: _received(current, "still here"), within=5)
        [held] = await hub_connections(redis, name)
        assert held["sub"] == "1"
    finally:
        hub.stop()
        await asyncio.wait_for(runner, 10)
