"""The hub keeps nothing of a subscription it could not make (services/api/push/hub.py): while
its Pub/Sub connection is away, a subscribe waits for a turn of the connection that never comes,
and is answered ``try again`` (docs/api.md section 9); every such try, a socket's ten a second,
must not stay behind until the connection is back."""

from __future__ import annotations

import asyncio

from services.api.push.hub import Hub
from shared.settings import LadderSettings
from tests.api.test_ws_limits import Listener
from tests.helpers import eventually


async def test_subscribes_refused_while_the_connection_is_away_leave_nothing(
    settings: LadderSettings,
) -> None:
    hub = Hub("redis://127.0.0.1:1/0", f"ladder-hub-{settings.key_prefix}")
    runner = asyncio.create_task(hub.run())
    listener, channels = Listener(), [f"{settings.key_prefix}:push:user:u-{i}" for i in range(3)]
    try:
        for turn in range(100):
            channel = channels[turn % len(channels)]
            try:
                await hub.subscribe(channel, listener, wait=0.001)
            except TimeoutError:
                hub.unsubscribe(channel, listener)  # as a socket's subscribe that failed does
        assert (hub.subscribers, hub.channels) == (0, 0)
        assert hub._pending == {}
    finally:
        hub.stop()
        await asyncio.wait_for(runner, 10)


async def test_a_subscribe_answered_in_time_leaves_nothing_either(settings: LadderSettings) -> None:
    hub = Hub(settings.redis_url, f"ladder-hub-{settings.key_prefix}")
    runner = asyncio.create_task(hub.run())
    channel = f"{settings.key_prefix}:push:user:u-1"
    try:

        async def connected() -> bool:
            return hub.connected

        await eventually(connected)
        await hub.subscribe(channel, Listener())
        assert hub.channels == 1 and hub._pending == {}
    finally:
        hub.stop()
        await asyncio.wait_for(runner, 10)
