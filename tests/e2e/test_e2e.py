"""A score travels the whole way: API, outbox relay, broker, all three consumers, pushes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from shared.db import open_engine
from tests.helpers import SERVER, eventually, player_token
from tests.stack import Stack, open_socket

pytestmark = pytest.mark.stack


async def test_score_travels_through_all_four_services(stack: Stack) -> None:
    rival, hero = f"rival-{uuid.uuid4().hex[:6]}", f"hero-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
        first = await api.post(
            "/v1/boards/main/scores", json={"user_id": rival, "region": "eu", "value": 10}
        )
        assert first.status_code == 200, first.text
        assert first.json()["periods"]["weekly"]["rank"] == 1

        rival_socket = await open_socket(stack, player_token(rival))
        hero_socket = await open_socket(stack, player_token(hero))
        watcher = await open_socket(stack, player_token("watcher"))
        await watcher.send({"op": "subscribe", "topic": "leaderboard:main:global:alltime"})
        await watcher.sync()

        event_id = f"e2e-{uuid.uuid4().hex[:8]}"
        posted = datetime.now(UTC).replace(microsecond=0)
        answer = await api.post(
            "/v1/boards/main/scores",
            json={
                "event_id": event_id,
                "user_id": hero,
                "region": "eu",
                "value": 25,
                "display_name": "Hero",
            },
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["duplicate"] is False
        assert set(body["periods"]) == {"daily", "weekly", "monthly", "alltime"}
        for result in body["periods"].values():
            assert result["rank"] == 1
            assert result["previous_rank"] is None
            assert result["score"] == 25

        # The notifier: the hero entered the top 1 of its region; the rival was pushed out.
        entered = await hero_socket.expect(
            lambda m: m["type"] == "rank" and m["period"] == "alltime"
        )
        assert entered["reason"] == "entered_top"
        assert entered["top"] == 1
        assert entered["scope"] == "region:eu"
        assert entered["user_id"] == hero
        # The rival may first hear of its own first score, which entered the top 1 then.
        overtaken = await rival_socket.expect(
            lambda m: (
                m["type"] == "rank" and m["period"] == "alltime" and m["reason"] != "entered_top"
            )
        )
        assert overtaken["reason"] == "overtaken"
        assert overtaken["user_id"] == rival
        assert (overtaken["rank"], overtaken["previous_rank"], overtaken["top"]) == (2, 1, 1)
        assert overtaken["score"] == 10

        # The aggregator: the hero leads the merged global view, pushed to subscribers. Its as_of
        # moves once the merge batch holding the hero's mark, taken after the POST, is drained: a
        # pass partway shows the hero before it does.
        async def global_leader() -> dict[str, Any] | None:
            page = (await api.get("/v1/boards/main/leaderboard", params={"scope": "global"})).json()
            leads = page["entries"] and page["entries"][0]["user_id"] == hero
            merged = page["as_of"] and datetime.fromisoformat(page["as_of"]) >= posted
            return page if leads and merged else None

        page = await eventually(global_leader)
        assert [e["user_id"] for e in page["entries"]] == [hero, rival]
        assert page["entries"][0] == {
            "rank": 1,
            "user_id": hero,
            "score": 25,
            "display_name": "Hero",
            "metadata": None,
        }
        pushed = await watcher.expect(
            lambda m: (
                m["type"] == "leaderboard"
                and bool(m["entries"])
                and m["entries"][0]["user_id"] == hero
            )
        )
        assert pushed["scope"] == "global"
        assert pushed["period"] == "alltime"

        # History: the event is in MySQL exactly once, and served by the events read.
        async with open_engine(stack.settings.mysql_url) as engine:

            async def stored(stored_id: str) -> int | None:
                async with engine.connect() as conn:
                    count = await conn.scalar(
                        text("SELECT COUNT(*) FROM score_events WHERE event_id = :e"),
                        {"e": stored_id},
                    )
                return int(count or 0) or None

            assert await eventually(lambda: stored(event_id)) == 1
            # Once more after a later event of the board is stored (history takes the board's
            # events in order): a copy stored after the first would be counted by then.
            later = f"e2e-later-{uuid.uuid4().hex[:8]}"
            sentinel = {"event_id": later, "user_id": rival, "region": "eu", "value": 1}
            posted = await api.post("/v1/boards/main/scores", json=sentinel)
            assert posted.status_code == 200, posted.text
            assert await eventually(lambda: stored(later)) == 1
            assert await stored(event_id) == 1
        events = (await api.get(f"/v1/boards/main/users/{hero}/events")).json()["events"]
        assert [e["event_id"] for e in events] == [event_id]
        assert events[0]["value"] == 25

        for socket in (rival_socket, hero_socket, watcher):
            await socket.connection.close()
