"""A new subscriber of a live topic (docs/api.md section 9) is sent the view's current state,
then every change, and never a view older than one it was sent before."""

from __future__ import annotations

import json

import orjson
import pytest
import websockets
from redis.asyncio import Redis

from services.api.push.ws import Client
from shared.keys import Keys
from shared.live_maths import hot_message
from shared.settings import DEV_SERVER_KEY, LadderSettings
from tests.helpers import eventually, serve, until_pong

TOPIC = "leaderboard:main:hot:10"


def view(as_of: str, score: float) -> bytes:
    return orjson.dumps(
        hot_message("main", 10, as_of, [{"rank": 1, "user_id": "u-1", "score": score}])
    )


async def test_a_push_that_comes_while_the_current_view_is_read_is_not_followed_by_an_older_view(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored, channel = keys.hot_view("main", 10), keys.board_channel("main", "hot", "10")
    await redis.set(stored, view("2026-12-05T10:00:01.000Z", 1.0))
    read, deliver = Client.current_view, Client.deliver
    delivered: list[str] = []

    def recorded(self: Client, text: str, *channel: str) -> None:
        delivered.append(text)
        deliver(self, text, *channel)

    async def read_overtaken(self: Client, topic: str) -> str | None:
        # The read finds the view stored then; before its answer is back, the aggregator
        # stores and publishes a newer one, whose push reaches the socket first.
        current = await read(self, topic)
        newer = view("2026-12-05T10:00:02.000Z", 2.0)
        await redis.set(stored, newer)
        await redis.publish(channel, newer)

        async def pushed() -> bool:
            return newer.decode() in delivered

        await eventually(pushed, within=5)
        return current

    monkeypatch.setattr(Client, "deliver", recorded)
    monkeypatch.setattr(Client, "current_view", read_overtaken)
    async with serve(quiet) as url, websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as ws:
        await ws.send(json.dumps({"op": "subscribe", "topic": TOPIC}))
        sent = await until_pong(ws)
        monkeypatch.setattr(Client, "current_view", read)
        # Without a push meanwhile, a subscriber is sent the current view as before.
        await ws.send(json.dumps({"op": "unsubscribe", "topic": TOPIC}))
        await ws.send(json.dumps({"op": "subscribe", "topic": TOPIC}))
        again = await until_pong(ws)
    assert [m["as_of"] for m in sent] == ["2026-12-05T10:00:02.000Z"]
    assert [m["as_of"] for m in again] == ["2026-12-05T10:00:02.000Z"]
