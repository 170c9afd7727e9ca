"""Scheduled seasons and period ends against the real services (docs/api.md sections 3, 8b).

A board with the schedule ``* * * * *`` has a season a minute. With a lateness of 2 s, the
season closes a few seconds after its minute: exactly one ``period.closed`` on the test's own
``<prefix>.periods`` exchange, with the final standings of every scope, one ``period_closed``
on the socket, a new season that starts empty and the old one readable by its id; with two
aggregator processes racing the close, and with the broker out of the aggregators' reach at
the close (the message waits in the outbox until an aggregator that reaches it is back).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from redis.asyncio import Redis

from services.aggregator.closer import DERIVE_WAIT
from shared.amqp import connect as connect_broker
from shared.keys import Keys
from shared.periods import close_name, window_of
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import ADMIN, SERVER, eventually, player_token
from tests.stack import ROOT, Stack, answers_ok, free_port, open_socket

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

LATENESS = "2"
MINUTES = "* * * * *"
# A minute's season, its lateness, the merge and the close's grace, and time to spare.
CLOSE_WITHIN = 90.0


@pytest.fixture
def season_stack(
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    mysql_database: str,
    tmp_path: Path,
) -> Iterator[Stack]:
    """The four services with a lateness of 2 s, for this test alone."""
    ladder = Stack(settings, tmp_path / "run", extra_env={"LADDER_ALLOWED_LATENESS": LATENESS})
    try:
        ladder.start()
        yield ladder
    finally:
        ladder.shutdown()


def spawn_aggregator(stack: Stack, **env: str) -> tuple[subprocess.Popen[bytes], int]:
    """Another aggregator process of the stack (its own ops port), with ``env`` on top."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "services.aggregator"],
        cwd=ROOT,
        env={**stack.env, "LADDER_AGGREGATOR_PORT": str(port), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, port


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
async def periods_tap(settings: LadderSettings) -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """A queue of the test's own bound to ``<prefix>.periods``: what a rewards service sees."""
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        exchange = await Topology(settings.broker_prefix).declare_periods_exchange(channel)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange)
        yield queue


async def closed_messages(
    tap: aio_pika.abc.AbstractQueue, within: float
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message the tap receives within ``within`` seconds."""
    found: list[aio_pika.abc.AbstractIncomingMessage] = []
    end = time.monotonic() + within
    while time.monotonic() < end:
        message = await tap.get(no_ack=True, fail=False)
        if message is None:
            await asyncio.sleep(0.2)
        else:
            found.append(message)
    return found


async def first_message(
    tap: aio_pika.abc.AbstractQueue, board_id: str, within: float
) -> dict[str, Any]:
    end = time.monotonic() + within
    while time.monotonic() < end:
        message = await tap.get(no_ack=True, fail=False)
        if message is None:
            await asyncio.sleep(0.2)
            continue
        body: dict[str, Any] = json.loads(message.body)
        if body["board_id"] == board_id and body["period"] == "season":
            season = window_of("season", body["period_id"], "UTC", MINUTES)
            assert message.message_id == f"{board_id}:season:{close_name(season)}"
            return body
    raise AssertionError(f"no period.closed of {board_id} within {within} s")


async def start_of_a_minute() -> None:
    """Wait, if need be, so that the writes that follow fall well inside one minute."""
    now = datetime.now(UTC)
    if now.second > 40:
        await asyncio.sleep(61 - now.second)


async def play_a_season(api: httpx.AsyncClient, board: str) -> str:
    """The season's board: a 35 (30 in eu, 5 in na), c 20 (na), b 10 (eu); its period id."""
    plays = [("a", "eu", 30, "red"), ("b", "eu", 10, None), ("c", "na", 20, "blue")]
    plays.append(("a", "na", 5, "red"))
    season = ""
    for user, region, value, team in plays:
        body: dict[str, Any] = {"user_id": user, "region": region, "value": value}
        if team:
            body["team_id"] = team
        answer = await api.post(f"/v1/boards/{board}/scores", json=body)
        assert answer.status_code == 200, answer.text
        season = answer.json()["periods"]["season"]["period_id"]
    return season


def assert_final(body: dict[str, Any], board: str, season: str, *, teams: bool = True) -> None:
    assert body["schema"] == 1
    assert body["type"] == "period.closed"
    assert (body["board_id"], body["period"], body["period_id"]) == (board, "season", season)
    assert body["closed_at"].endswith("Z")
    scopes = body["scopes"]

    def ranked(scope: str, key: str = "user_id") -> list[tuple[int, str, int]]:
        return [(e["rank"], e[key], e["score"]) for e in scopes[scope]]

    assert ranked("global") == [(1, "a", 35), (2, "c", 20), (3, "b", 10)]
    assert ranked("region:eu") == [(1, "a", 30), (2, "b", 10)]
    assert ranked("region:na") == [(1, "c", 20), (2, "a", 5)]
    if teams:
        assert ranked("teams", "team_id") == [(1, "red", 35), (2, "blue", 20)]
    else:
        # The teams board is the aggregator's, of the events it consumed: none reached it, and
        # the scope is there, empty, as an incr board's always is.
        assert scopes["teams"] == []


async def test_a_minute_season_closes_once_with_two_aggregators(
    season_stack: Stack, periods_tap: aio_pika.abc.AbstractQueue
) -> None:
    stack = season_stack
    board = f"s-{uuid.uuid4().hex[:8]}"
    second, port = spawn_aggregator(stack)
    try:
        assert answers_ok(f"http://127.0.0.1:{port}/readyz", 60)
        async with httpx.AsyncClient(base_url=stack.api, headers=ADMIN, timeout=10) as admin:
            bad = await admin.put(f"/v1/boards/{board}", json={"schedule": "* * * *"})
            assert bad.status_code == 422, bad.text
            never = await admin.put(f"/v1/boards/{board}", json={"schedule": "0 0 31 2 *"})
            assert never.status_code == 422, never.text
            made = await admin.put(
                f"/v1/boards/{board}", json={"schedule": MINUTES, "regions": ["eu", "na"]}
            )
            assert made.status_code == 201, made.text
            assert made.json()["periods"][-1] == "season"
            # A board without a schedule keeps no season.
            none = await admin.get("/v1/boards/main/leaderboard", params={"period": "season"})
            assert none.status_code == 404, none.text

        watcher = await open_socket(stack, player_token("watcher"))
        for scope in ("global", "region:eu"):
            await watcher.send({"op": "subscribe", "topic": f"leaderboard:{board}:{scope}:season"})
        await watcher.sync()
        await start_of_a_minute()
        async with httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
            season = await play_a_season(api, board)

            body = await first_message(periods_tap, board, CLOSE_WITHIN)
            assert_final(body, board, season)
            pushed = await watcher.expect(
                lambda m: m["type"] == "period_closed" and m["scope"] == "global", within=10
            )
            assert pushed["period_id"] == season
            assert [e["user_id"] for e in pushed["entries"]] == ["a", "c", "b"]

            # Exactly once: nothing more for this board and period id, from either process.
            more = await closed_messages(periods_tap, 4.0)
            assert [json.loads(m.body)["board_id"] for m in more].count(board) == 0
            await watcher.sync()
            pushes = [
                m
                for m in watcher.received
                if m["type"] == "period_closed" and m["scope"] == "global"
            ]
            assert len(pushes) == 1

            # A new season starts empty; the closed one stays readable by its id.
            current = (
                await api.get(
                    f"/v1/boards/{board}/leaderboard",
                    params={"scope": "global", "period": "season"},
                )
            ).json()
            assert current["period_id"] != season
            assert current["entries"] == []
            old = await api.get(
                f"/v1/boards/{board}/leaderboard",
                params={"scope": "global", "period": "season", "period_id": season},
            )
            assert old.status_code == 200, old.text
            assert [e["user_id"] for e in old.json()["entries"]] == ["a", "c", "b"]
            # An event for the closed season is refused: older than the lateness.
            late = await api.post(
                f"/v1/boards/{board}/scores",
                json={
                    "user_id": "z",
                    "region": "eu",
                    "value": 1,
                    "occurred_at": start(season),
                },
            )
            assert late.status_code == 422, late.text
        await watcher.connection.close()
    finally:
        stop_process(second)


def start(season: str) -> str:
    """The season's start (its id, in UTC on this board) as RFC 3339."""
    return f"{season}:00Z"


async def test_a_season_closed_while_the_broker_is_away_is_published_once_it_is_back(
    season_stack: Stack, periods_tap: aio_pika.abc.AbstractQueue, redis: Redis, keys: Keys
) -> None:
    stack = season_stack
    board = f"s-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=stack.api, headers=ADMIN, timeout=10) as admin:
        made = await admin.put(
            f"/v1/boards/{board}", json={"schedule": MINUTES, "regions": ["eu", "na"]}
        )
        assert made.status_code == 201, made.text
    # The stack's aggregator makes way for two that cannot reach the broker: no event reaches
    # them, and the close's last merge alone makes the global board.
    stack.ctl("stop", "aggregator")
    away = "amqp://guest:guest@127.0.0.1:1/"
    cut_off = [spawn_aggregator(stack, LADDER_AMQP_URL=away)[0] for _ in range(2)]
    try:
        watcher = await open_socket(stack, player_token("watcher"))
        await watcher.send({"op": "subscribe", "topic": f"leaderboard:{board}:global:season"})
        await watcher.sync()
        await start_of_a_minute()
        async with httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
            season = await play_a_season(api, board)
        claim = keys.period_closed(
            board, "season", close_name(window_of("season", season, "UTC", MINUTES))
        )

        async def claimed() -> bool:
            return bool(await redis.exists(claim))

        # No event reaches a derive step either: the close first waits DERIVE_WAIT for it (the
        # teams scope), then goes on without.
        await eventually(claimed, within=CLOSE_WITHIN + DERIVE_WAIT)
        pushed = await watcher.expect(lambda m: m["type"] == "period_closed", within=10)
        assert [e["user_id"] for e in pushed["entries"]] == ["a", "c", "b"]
        # The message waits in the outbox, once, though two processes closed the period.
        await asyncio.sleep(3)
        assert await redis.xlen(keys.periods_outbox(board)) == 1
        assert [json.loads(m.body)["board_id"] for m in await closed_messages(periods_tap, 1)] == []
        await watcher.sync()
        assert sum(m["type"] == "period_closed" for m in watcher.received) == 1
        await watcher.connection.close()
    finally:
        for process in cut_off:
            stop_process(process)
    # The broker is back within the aggregators' reach: the waiting message goes out, once.
    stack.ctl("start", "aggregator")
    body = await first_message(periods_tap, board, 30)
    assert_final(body, board, season, teams=False)
    more = await closed_messages(periods_tap, 4.0)
    assert [json.loads(m.body)["board_id"] for m in more].count(board) == 0
    assert await redis.xlen(keys.periods_outbox(board)) == 0
