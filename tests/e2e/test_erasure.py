"""Erase a user and delete a board against the four running services (docs/api.md section 8b):
gone from every view, friends, the feed and history; still gone after `make rebuild` and after
an old event of theirs is delivered to the consumers again; a deleted board's name takes a fresh
board that shows none of the old scores."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.amqp import connect as connect_broker
from shared.db import count_events, friend_requests, friendships, open_engine, snapshots
from shared.keys import Keys
from tests.helpers import ADMIN, SERVER, eventually, player, republish, tap_fanout
from tests.stack import Stack

pytestmark = pytest.mark.stack

PERIODS = ("daily", "weekly", "monthly", "alltime")


@contextlib.asynccontextmanager
async def session(stack: Stack) -> AsyncIterator[tuple[httpx.AsyncClient, AsyncEngine, Any, Any]]:
    """A server-key client of the stack's API, its history database, and the score exchange
    with a tap queue of its own on it (to take events as they went out and publish them again)."""
    settings = stack.settings
    connection = await connect_broker(settings.amqp_urls)
    async with (
        connection,
        httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api,
        open_engine(settings.mysql_url) as engine,
    ):
        channel = await connection.channel()
        exchange, tap = await tap_fanout(channel, settings.broker_prefix)
        yield api, engine, exchange, tap


def ids(entries: list[dict[str, Any]]) -> set[str]:
    return {e["user_id"] for e in entries}


async def board_views(api: httpx.AsyncClient, board: str) -> dict[str, set[str]]:
    """The users every scope of every period of ``board`` lists (regions eu and na)."""
    seen: dict[str, set[str]] = {}
    for period in PERIODS:
        for scope in ("global", "region:eu", "region:na"):
            response = await api.get(
                f"/v1/boards/{board}/leaderboard",
                params={"scope": scope, "period": period, "limit": 100},
            )
            assert response.status_code == 200, response.text
            seen[f"{period}/{scope}"] = ids(response.json()["entries"])
    return seen


async def taken(tap: Any, wanted: str) -> aio_pika.abc.AbstractIncomingMessage:
    """The first message of the tap whose body names ``wanted`` (others are dropped)."""

    async def probe() -> Any:
        message = await tap.get(no_ack=True, fail=False)
        return message if message is not None and wanted in message.body.decode() else None

    found: aio_pika.abc.AbstractIncomingMessage = await eventually(probe)
    return found


async def erasure_done(api: httpx.AsyncClient, user: str) -> bool:
    response = await api.get(f"/v1/erasures/{user}", headers=ADMIN)
    assert response.status_code == 200, response.text
    return bool(response.json()["status"] == "done")


async def test_an_erased_user_is_gone_everywhere_and_stays_gone(stack: Stack, redis: Redis) -> None:
    settings = stack.settings
    keys = Keys(settings.key_prefix)
    tag = uuid.uuid4().hex[:6]
    victim, other, third = f"v-{tag}", f"o-{tag}", f"t-{tag}"
    board = f"b-{tag}"
    async with session(stack) as (api, engine, exchange, tap):
        put = await api.put(f"/v1/boards/{board}", json={"badges": {"bronze": 10}}, headers=ADMIN)
        assert put.status_code == 201, put.text
        posts = [
            ("main", victim, "eu", 50),
            ("main", victim, "na", 7),
            ("main", other, "eu", 20),
            (board, victim, "eu", 40),
            (board, other, "na", 30),
        ]
        for i, (bid, user, region, value) in enumerate(posts):
            body = {
                "event_id": f"e{i}-{tag}",
                "user_id": user,
                "region": region,
                "value": value,
                "team_id": "red",
                "display_name": user,
            }
            answer = await api.post(f"/v1/boards/{bid}/scores", json=body)
            assert answer.status_code == 200, answer.text
        old = await taken(tap, f'"e0-{tag}"')
        assert (await api.put(f"/v1/users/{victim}/friends/{other}")).status_code == 204
        asked = await api.put(f"/v1/users/{victim}/friends/{third}", headers=player(victim))
        assert asked.status_code == 202

        async def everywhere() -> bool:
            views = await board_views(api, "main")
            badges = await api.get(f"/v1/boards/{board}/users/{victim}/badges")
            feed = await api.get(f"/v1/boards/{board}/feed")
            return (
                await count_events(engine, "main", user_id=victim) == 2
                and await count_events(engine, board, user_id=victim) == 1
                and victim in views["alltime/global"]
                and victim in ids(feed.json()["events"])
                and bool(badges.json()["badges"])
            )

        await eventually(everywhere, within=20)

        erase = await api.delete(f"/v1/users/{victim}", headers=ADMIN)
        assert erase.status_code == 202, erase.text
        assert erase.headers["location"] == f"/v1/erasures/{victim}"
        assert erase.json()["status"] == "pending"
        await eventually(lambda: erasure_done(api, victim), within=20)

        async def gone() -> None:
            for bid in ("main", board):
                views = await board_views(api, bid)
                assert all(victim not in users for users in views.values()), views
                feed = (await api.get(f"/v1/boards/{bid}/feed")).json()["events"]
                assert victim not in ids(feed)
                events = await api.get(f"/v1/boards/{bid}/users/{victim}/events")
                assert events.json()["events"] == []
                badges = await api.get(f"/v1/boards/{bid}/users/{victim}/badges")
                assert badges.json()["badges"] == []
                standing = await api.get(f"/v1/boards/{bid}/users/{victim}")
                assert standing.status_code == 404
                assert await count_events(engine, bid, user_id=victim) == 0
                assert not await redis.hexists(keys.names(bid), victim)
            # Everyone else is still there.
            assert other in (await board_views(api, "main"))["alltime/global"]
            assert (await api.get(f"/v1/users/{other}/friends")).json()["friends"] == []
            assert (await api.get(f"/v1/users/{victim}/friends")).json()["friends"] == []
            listed = (await api.get(f"/v1/users/{third}/friends/requests")).json()
            assert listed == {"incoming": [], "outgoing": []}
            async with engine.connect() as conn:
                for table in (friendships, friend_requests):
                    c = table.c
                    rows = await conn.scalar(
                        select(func.count())
                        .select_from(table)
                        .where((c.user_id == victim) | (c.friend_id == victim))
                    )
                    assert rows == 0
                stored = await conn.scalars(select(snapshots.c.entries))
                assert all(f'"{victim}"' not in entries for entries in stored)
            records = [
                k async for k in redis.scan_iter(match=keys.idempotency_match(victim), count=1000)
            ]
            assert records == []

        await gone()

        # An old event of the victim delivered to every consumer again, then a marker behind it:
        # once the marker is everywhere, the old event was handled (and left out).
        await republish(exchange, old)
        marker = f"m-{tag}"
        posted = await api.post(
            "/v1/boards/main/scores",
            json={"event_id": marker, "user_id": other, "region": "eu", "value": 1},
        )
        assert posted.status_code == 200

        async def marker_everywhere() -> bool:
            feed = (await api.get("/v1/boards/main/feed")).json()["events"]
            return await count_events(engine, "main", marker) == 1 and marker in {
                e["event_id"] for e in feed
            }

        await eventually(marker_everywhere, within=20)
        await eventually(lambda: _merged(api, other, 21), within=10)
        await gone()

        # The rebuild, from the history database, brings nothing of the victim back.
        stack.make("rebuild")
        await eventually(lambda: _merged(api, other, 21), within=10)
        await gone()


async def _merged(api: httpx.AsyncClient, user: str, score: int) -> bool:
    standing = await api.get("/v1/boards/main/users/" + user, params={"scope": "global"})
    return standing.status_code == 200 and standing.json()["score"] == score


async def deletion_done(api: httpx.AsyncClient, board: str) -> bool:
    response = await api.get(f"/v1/board-deletions/{board}", headers=ADMIN)
    assert response.status_code == 200, response.text
    return bool(response.json()["status"] == "done")


async def test_a_deleted_board_is_404_and_its_name_takes_a_fresh_board(
    stack: Stack, redis: Redis
) -> None:
    settings = stack.settings
    keys = Keys(settings.key_prefix)
    tag = uuid.uuid4().hex[:6]
    board, user = f"d-{tag}", f"u-{tag}"
    async with session(stack) as (api, engine, exchange, tap):
        assert (await api.put(f"/v1/boards/{board}", json={}, headers=ADMIN)).status_code == 201
        body = {"event_id": f"old-{tag}", "user_id": user, "region": "eu", "value": 9}
        assert (await api.post(f"/v1/boards/{board}/scores", json=body)).status_code == 200
        old = await taken(tap, f'"old-{tag}"')

        async def stored() -> bool:
            views = await board_views(api, board)
            return await count_events(engine, board) == 1 and user in views["alltime/global"]

        await eventually(stored, within=20)

        deleted = await api.delete(f"/v1/boards/{board}", headers=ADMIN)
        assert deleted.status_code == 202, deleted.text
        assert deleted.json()["purge"] is False
        assert (await api.get(f"/v1/boards/{board}")).status_code == 404
        busy = await api.put(f"/v1/boards/{board}", json={}, headers=ADMIN)
        assert busy.status_code == 409, busy.text
        await eventually(lambda: deletion_done(api, board), within=30)
        assert [k async for k in redis.scan_iter(match=keys.board_match(board))] == []
        # Its history stays (no purge), but is not the fresh board's.
        assert await count_events(engine, board) == 1

        fresh = await api.put(f"/v1/boards/{board}", json={"operator": "best"}, headers=ADMIN)
        assert fresh.status_code == 201, fresh.text

        async def empty() -> None:
            views = await board_views(api, board)
            assert all(not users for users in views.values()), views
            assert (await api.get(f"/v1/boards/{board}/feed")).json()["events"] == []
            events = await api.get(f"/v1/boards/{board}/users/{user}/events")
            assert events.json()["events"] == []

        await empty()
        # The old board's event delivered again, then a marker on the fresh board behind it.
        await republish(exchange, old)
        marker = {"event_id": f"new-{tag}", "user_id": f"n-{tag}", "region": "na", "value": 3}
        assert (await api.post(f"/v1/boards/{board}/scores", json=marker)).status_code == 200

        async def marker_merged() -> bool:
            views = await board_views(api, board)
            return f"n-{tag}" in views["alltime/global"] and await count_events(engine, board) == 2

        await eventually(marker_merged, within=20)
        views = await board_views(api, board)
        assert user not in set().union(*views.values())
        stack.make("rebuild")
        await eventually(marker_merged, within=20)
        views = await board_views(api, board)
        assert user not in set().union(*views.values())
        assert f"n-{tag}" in views["alltime/global"]

        # Purged: the fresh board's history goes; the first board's, kept by its deletion, stays.
        purged = await api.delete(f"/v1/boards/{board}", params={"purge": "true"}, headers=ADMIN)
        assert purged.status_code == 202 and purged.json()["purge"] is True
        await eventually(lambda: deletion_done(api, board), within=30)
        assert await count_events(engine, board) == 1
        assert await count_events(engine, board, event_id=f"old-{tag}") == 1
