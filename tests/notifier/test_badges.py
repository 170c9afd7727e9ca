"""Badges (docs/api.md section 3): earned the first time a single event's value reaches a threshold,
awarded and pushed exactly once per user and board however often the event is delivered."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import PubSub

from services.notifier.handlers import Notify
from services.notifier.rules import earned, reaches
from shared.amqp import connect as connect_broker
from shared.boards import Board, BoardCatalog
from shared.events import PeriodResult, ScoreAccepted, rfc3339
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.helpers import (
    SERVER,
    UNREACHABLE_BROKER,
    api_client,
    eventually,
    player_token,
    republish,
    tap_fanout,
)
from tests.stack import Stack, open_socket

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

QUEST = Board(board_id="quest", badges={"bronze": 100, "silver": 500})
LAPS = Board(board_id="laps", operator="best", order="asc", badges={"sub-60": 60})
# The notifier's seen mark: its bit (a SETBIT offset) in the marks byte that starts the event's
# record (shared/lua/live.lua, SEEN_BITS).
NOTIFIER_BIT = 6
T0 = datetime(2026, 11, 29, 17, 0, 0, tzinfo=UTC)


# --- helpers ---------------------------------------------------------------------------------


async def add_board(redis: Redis, keys: Keys, board: Board) -> None:
    """Store a definition where every service's catalog reads it."""
    await redis.hset(keys.boards, board.board_id, board.model_dump_json())


def accepted(
    value: int,
    *,
    board_id: str = "quest",
    user_id: str = "u-1",
    event_id: str | None = None,
    at: datetime = T0,
) -> ScoreAccepted:
    """An event as the notifier receives it, first in its region."""
    return ScoreAccepted(
        event_id=event_id or uuid.uuid4().hex,
        board_id=board_id,
        user_id=user_id,
        region="eu",
        value=value,
        occurred_at=at - timedelta(seconds=1),
        accepted_at=at,
        periods={
            "alltime": PeriodResult(
                period_id="all", score=value, rank=1, previous_rank=None, improved=True
            )
        },
    )


def awarded_total() -> float:
    return REGISTRY.get_sample_value("ladder_notifier_badges_awarded_total") or 0.0


class Channel:
    """A Pub/Sub subscriber of one channel that can tell when it has heard everything."""

    def __init__(self, redis: Redis, pubsub: PubSub, channel: str) -> None:
        self._redis = redis
        self._pubsub = pubsub
        self._channel = channel

    async def drain(self) -> list[dict[str, Any]]:
        """Everything published on the channel so far, in the order each node published it.

        A marker published now on a node arrives after every earlier message that node
        published on the channel: one is published on every primary (one Redis, or each
        primary of a cluster, where a badge comes from its board's primary and a rank push
        from its channel's, and their order is not kept across the two), so reading up to the
        last of them needs no sleeping.
        """
        markers = set()
        for node in (
            self._redis.get_primaries() if isinstance(self._redis, RedisCluster) else [None]
        ):
            marker = uuid.uuid4().hex
            markers.add(marker)
            body = orjson.dumps({"type": "marker", "id": marker})
            if node is None:
                await self._redis.publish(self._channel, body)
            else:
                await self._redis.execute_command("PUBLISH", self._channel, body, target_nodes=node)
        heard: list[dict[str, Any]] = []
        async with asyncio.timeout(5.0):
            while markers:
                # None for a subscribe confirmation, which is skipped.
                message = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=1.0
                )
                if message is None:
                    continue
                body = orjson.loads(message["data"])
                if body["type"] == "marker" and body.get("id") in markers:
                    markers.remove(body["id"])
                else:
                    heard.append(body)
        return heard

    async def badges(self) -> list[dict[str, Any]]:
        return [m for m in await self.drain() if m["type"] == "badge"]


@contextlib.asynccontextmanager
async def listening(redis: Redis, channel: str) -> AsyncIterator[Channel]:
    pubsub = redis.pubsub()
    try:
        await pubsub.subscribe(channel)
        yield Channel(redis, pubsub, channel)
    finally:
        await pubsub.aclose()


@pytest.fixture
async def notify(redis: Redis, keys: Keys) -> Notify:
    catalog = BoardCatalog(redis, keys)
    await catalog.ensure_defaults()
    await add_board(redis, keys, QUEST)
    await add_board(redis, keys, LAPS)
    return Notify(redis, keys, catalog)


def badge_message(badge: str, user_id: str = "u-1", board_id: str = "quest") -> dict[str, str]:
    return {"type": "badge", "board_id": board_id, "user_id": user_id, "badge": badge}


# --- the rule --------------------------------------------------------------------------------


def test_a_threshold_is_reached_from_the_better_side() -> None:
    assert reaches(100, 100, descending=True)
    assert reaches(101, 100, descending=True)
    assert not reaches(99, 100, descending=True)
    # Lower is better on asc boards: a threshold is a mark to get down to.
    assert reaches(60, 60, descending=False)
    assert reaches(59, 60, descending=False)
    assert not reaches(61, 60, descending=False)
    assert earned(600, QUEST.badges, descending=True) == ["bronze", "silver"]
    assert earned(99, QUEST.badges, descending=True) == []


# --- the notifier ----------------------------------------------------------------------------


async def test_the_same_event_handled_twice_awards_once(
    notify: Notify, redis: Redis, keys: Keys
) -> None:
    event = accepted(150)
    before = awarded_total()
    async with listening(redis, keys.user_channel("u-1")) as channel:
        await notify([event])
        await notify([event])
        assert await channel.badges() == [badge_message("bronze")]
    assert await redis.hgetall(keys.badges("quest", "u-1")) == {"bronze": rfc3339(T0)}
    assert awarded_total() - before == 1


async def test_an_event_twice_in_one_batch_awards_once(
    notify: Notify, redis: Redis, keys: Keys
) -> None:
    event = accepted(150)
    async with listening(redis, keys.user_channel("u-1")) as channel:
        await notify([event, event])
        assert await channel.badges() == [badge_message("bronze")]


async def test_two_events_reaching_a_threshold_award_once_at_the_first(
    notify: Notify, redis: Redis, keys: Keys
) -> None:
    later = T0 + timedelta(seconds=30)
    async with (
        listening(redis, keys.user_channel("u-1")) as one,
        listening(redis, keys.user_channel("u-2")) as two,
    ):
        # In two deliveries...
        await notify([accepted(120, user_id="u-1")])
        await notify([accepted(130, user_id="u-1", at=later)])
        # ...and in one batch.
        await notify([accepted(120, user_id="u-2"), accepted(130, user_id="u-2", at=later)])
        assert await one.badges() == [badge_message("bronze", "u-1")]
        assert await two.badges() == [badge_message("bronze", "u-2")]
    for user in ("u-1", "u-2"):
        assert await redis.hgetall(keys.badges("quest", user)) == {"bronze": rfc3339(T0)}


async def test_a_badge_keeps_the_time_of_the_first_event_however_late_it_is_handled(
    notify: Notify, redis: Redis, keys: Keys
) -> None:
    """Events are not always handled in the order they were accepted: a message given back to
    the queue comes after later ones, and two notifiers share the queue. The badge is pushed
    once, by whichever comes first, and keeps the earlier event's time (docs/api.md section 3:
    when Ladder accepted the event that earned it)."""
    later = T0 + timedelta(seconds=30)
    async with listening(redis, keys.user_channel("u-1")) as channel:
        await notify([accepted(130, at=later)])
        await notify([accepted(120)])
        assert await channel.badges() == [badge_message("bronze")]
    assert await redis.hgetall(keys.badges("quest", "u-1")) == {"bronze": rfc3339(T0)}
    # A later event earning it again changes nothing.
    await notify([accepted(140, at=later + timedelta(seconds=1))])
    assert await redis.hgetall(keys.badges("quest", "u-1")) == {"bronze": rfc3339(T0)}


async def test_a_notifier_that_died_after_awarding_does_not_award_again(
    notify: Notify, redis: Redis, keys: Keys
) -> None:
    event = accepted(150)
    async with listening(redis, keys.user_channel("u-1")) as channel:
        await notify([event])
        # As if it died before marking the event seen: the redelivery looks fresh.
        record = keys.idempotency("quest", event.event_id, event.user_id)
        assert await redis.getbit(record, NOTIFIER_BIT) == 1
        await redis.setbit(record, NOTIFIER_BIT, 0)
        await notify([event])
        heard = await channel.drain()
    assert [m for m in heard if m["type"] == "badge"] == [badge_message("bronze")]
    # The rank push, on the other hand, is decided by the mark alone: with it gone, it came
    # again.
    assert [m["reason"] for m in heard if m["type"] == "rank"] == ["entered_top"] * 2


async def test_thresholds_are_per_board(notify: Notify, redis: Redis, keys: Keys) -> None:
    async with (
        listening(redis, keys.user_channel("u-1")) as one,
        listening(redis, keys.user_channel("u-2")) as two,
    ):
        await notify([accepted(99)])
        assert await one.badges() == []
        await notify([accepted(600, at=T0 + timedelta(seconds=1))])
        assert await one.badges() == [badge_message("bronze"), badge_message("silver")]
        # Board main has no badges, however big the play.
        await notify([accepted(1_000_000, board_id="main", user_id="u-2")])
        assert await two.badges() == []
        # An asc board: lower is better, the threshold itself counts.
        await notify([accepted(61, board_id="laps", user_id="u-2")])
        assert await two.badges() == []
        await notify([accepted(60, board_id="laps", user_id="u-2")])
        assert await two.badges() == [badge_message("sub-60", "u-2", "laps")]
    assert await redis.hgetall(keys.badges("quest", "u-1")) == {
        "bronze": rfc3339(T0 + timedelta(seconds=1)),
        "silver": rfc3339(T0 + timedelta(seconds=1)),
    }
    assert await redis.exists(keys.badges("main", "u-2")) == 0
    assert await redis.hgetall(keys.badges("laps", "u-2")) == {"sub-60": rfc3339(T0)}


# --- the API ---------------------------------------------------------------------------------


async def test_the_badges_of_a_user_are_listed_oldest_first(
    settings: LadderSettings, redis: Redis, keys: Keys
) -> None:
    await add_board(redis, keys, QUEST)
    await redis.hset(
        keys.badges("quest", "u-1"),
        mapping={
            "silver": "2026-11-29T17:00:05.000Z",
            "gold": "2026-11-29T17:00:05.000Z",
            "bronze": "2026-11-29T17:00:00.000Z",
        },
    )
    quiet = settings.model_copy(update={"amqp_url": UNREACHABLE_BROKER})
    async with api_client(quiet) as client:
        listed = await client.get("/v1/boards/quest/users/u-1/badges")
        assert listed.status_code == 200, listed.text
        assert listed.json() == {
            "badges": [
                {"badge": "bronze", "awarded_at": "2026-11-29T17:00:00.000Z"},
                {"badge": "gold", "awarded_at": "2026-11-29T17:00:05.000Z"},
                {"badge": "silver", "awarded_at": "2026-11-29T17:00:05.000Z"},
            ]
        }
        none = await client.get("/v1/boards/quest/users/nobody/badges")
        assert none.status_code == 200, none.text
        assert none.json() == {"badges": []}

        unknown = await client.get("/v1/boards/nope/users/u-1/badges")
        assert unknown.status_code == 404, unknown.text
        assert unknown.headers["content-type"].startswith("application/problem+json")
        assert "nope" in unknown.json()["detail"]

        bad = await client.get("/v1/boards/quest/users/%20bad/badges")
        assert bad.status_code == 422, bad.text


# --- the whole way ---------------------------------------------------------------------------


@pytest.mark.stack
async def test_a_badge_reaches_the_player_once_through_the_stack(
    stack: Stack, redis: Redis
) -> None:
    settings = stack.settings
    keys = Keys(settings.key_prefix)
    # The services read board definitions from Redis; this one exists before anyone asks.
    await add_board(redis, keys, QUEST)
    user = f"u-{uuid.uuid4().hex[:6]}"
    connection = await connect_broker(settings.amqp_urls)
    async with connection, httpx.AsyncClient(base_url=stack.api, headers=SERVER, timeout=10) as api:
        channel = await connection.channel()
        exchange, tap = await tap_fanout(channel, settings.broker_prefix)

        socket = await open_socket(stack, player_token(user))
        event_id = f"badge-{uuid.uuid4().hex[:8]}"
        answer = await api.post(
            "/v1/boards/quest/scores",
            json={"event_id": event_id, "user_id": user, "region": "eu", "value": 150},
        )
        assert answer.status_code == 200, answer.text
        pushed = await socket.expect(lambda m: m["type"] == "badge")
        assert pushed == badge_message("bronze", user)

        message = await eventually(lambda: tap.get(no_ack=True, fail=False))
        assert event_id in message.body.decode()

        # The same message again, as the broker may deliver it...
        await republish(exchange, message)
        # ...and again as if the notifier had died after the award, before marking it seen.
        record = keys.idempotency("quest", event_id, user)
        await eventually(lambda: redis.getbit(record, NOTIFIER_BIT))
        await redis.setbit(record, NOTIFIER_BIT, 0)
        await republish(exchange, message)
        # A fresh event behind them that earns the next badge: once it arrives, they were handled.
        marker = await api.post(
            "/v1/boards/quest/scores", json={"user_id": user, "region": "eu", "value": 500}
        )
        assert marker.status_code == 200, marker.text
        await socket.expect(lambda m: m["type"] == "badge" and m["badge"] == "silver")

        badges = [m for m in socket.received if m["type"] == "badge"]
        assert badges == [badge_message("bronze", user), badge_message("silver", user)]

        listed = (await api.get(f"/v1/boards/quest/users/{user}/badges")).json()["badges"]
        assert [b["badge"] for b in listed] == ["bronze", "silver"]
        bronze_at = datetime.fromisoformat(listed[0]["awarded_at"])
        assert bronze_at <= datetime.fromisoformat(listed[1]["awarded_at"])
        await socket.connection.close()
