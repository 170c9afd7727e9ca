"""A hidden user on the running services (API, aggregator, history, notifier as processes):
gone from the pages and the top-10 pushes, its own read answering, back when shown again
within a merge interval. tests/api/test_hidden.py covers every view in detail."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.helpers import ADMIN, SERVER, eventually, player, player_token
from tests.stack import Stack, open_socket

pytestmark = pytest.mark.stack


async def test_hide_and_show_on_the_running_services(stack: Stack) -> None:
    tag = uuid.uuid4().hex[:6]
    cheat, other, third = f"cheat-{tag}", f"other-{tag}", f"third-{tag}"
    async with httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
        for user, region, value in ((cheat, "eu", 90), (other, "us", 50), (third, "eu", 30)):
            body = {"user_id": user, "region": region, "value": value}
            answer = await api.post("/v1/boards/main/scores", json=body)
            assert answer.status_code == 200, answer.text

        async def global_ids(want: list[str]) -> list[str] | None:
            page = (await api.get("/v1/boards/main/leaderboard", params={"scope": "global"})).json()
            ids = [e["user_id"] for e in page["entries"]]
            return ids if ids == want else None

        await eventually(lambda: global_ids([cheat, other, third]), within=20)
        watcher = await open_socket(stack, player_token("watcher"))
        await watcher.send({"op": "subscribe", "topic": "leaderboard:main:global:alltime"})
        await watcher.sync()

        hidden = f"/v1/boards/main/users/{cheat}/hidden"
        assert (await api.put(hidden, headers=ADMIN)).status_code == 204
        await eventually(lambda: global_ids([other, third]), within=20)
        pushed = await watcher.expect(lambda m: m["type"] == "leaderboard")
        assert [e["user_id"] for e in pushed["entries"]] == [other, third]
        assert [(e["user_id"], e["rank"]) for e in pushed["entries"]] == [(other, 1), (third, 2)]
        # Others cannot read it; it reads itself, ranked as if shown.
        assert (await api.get(f"/v1/boards/main/users/{cheat}")).status_code == 404
        own = await api.get(
            f"/v1/boards/main/users/{cheat}", params={"scope": "global"}, headers=player(cheat)
        )
        assert own.status_code == 200, own.text
        assert (own.json()["rank"], own.json()["score"]) == (1, 90)
        # Its writes are accepted and stay out.
        body = {"user_id": cheat, "region": "eu", "value": 5}
        assert (await api.post("/v1/boards/main/scores", json=body)).status_code == 200

        async def feed_without_cheat() -> list[Any] | None:
            feed = (await api.get("/v1/boards/main/feed")).json()["events"]
            users = {e["user_id"] for e in feed}
            return feed if other in users and cheat not in users else None

        await eventually(feed_without_cheat, within=20)
        assert await global_ids([other, third]) == [other, third]

        assert (await api.delete(hidden, headers=ADMIN)).status_code == 204
        await eventually(lambda: global_ids([cheat, other, third]), within=20)
        pushed = await watcher.expect(
            lambda m: m["type"] == "leaderboard" and len(m["entries"]) == 3
        )
        assert [e["user_id"] for e in pushed["entries"]] == [cheat, other, third]
        assert pushed["entries"][0]["score"] == 95
