"""Helpers shared by the tests: an in-process API client, player tokens, Redis snapshots."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import jwt
import orjson
import pytest
import uvicorn
import websockets
from asgi_lifespan import LifespanManager
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.types import ASGIApp

from services.aggregator.derive import Derive
from services.api.app import create_app
from services.api.serving.uvicorn_server import Server, build_server
from shared.boards import Board, BoardCatalog
from shared.consumer import ConsumerRunner
from shared.events import ScoreAccepted, rfc3339
from shared.functions import DERIVE_FUNCTION
from shared.keys import Keys
from shared.ops import running
from shared.ranking import id_of, parse_record, score_of
from shared.redis_cluster import LadderClusterPipeline
from shared.settings import DEV_ADMIN_KEY, DEV_JWT_SECRET, DEV_SERVER_KEY, LadderSettings
from tests.stack import free_port

T = TypeVar("T")

SERVER = {"Authorization": f"Bearer {DEV_SERVER_KEY}"}
ADMIN = {"Authorization": f"Bearer {DEV_ADMIN_KEY}"}
# Nothing listens on port 1: an API given this broker keeps every accepted event in its outbox,
# and its relay never touches Redis, so the cache holds still between two reads of it.
UNREACHABLE_BROKER = "amqp://guest:guest@127.0.0.1:1/"
T0 = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)


def accepted_event(
    event_id: str,
    *,
    board_id: str = "main",
    user_id: str = "u-1",
    value: int = 5,
    accepted_at: datetime = T0,
    display_name: str | None = "Ana",
) -> ScoreAccepted:
    """An accepted event as the consumers receive it, in region eu, team red-wombats, with its
    all-time result; occurred a second before it was accepted."""
    return ScoreAccepted.model_validate(
        {
            "event_id": event_id,
            "board_id": board_id,
            "user_id": user_id,
            "region": "eu",
            "team_id": "red-wombats",
            "display_name": display_name,
            "value": value,
            "occurred_at": accepted_at - timedelta(seconds=1),
            "accepted_at": accepted_at,
            "periods": {
                "alltime": {
                    "period_id": "all",
                    "score": value,
                    "rank": 1,
                    "previous_rank": None,
                    "improved": True,
                }
            },
        }
    )


def player_token(
    sub: str | None = "u-1",
    *,
    # Long enough for tokens made when tests are collected to outlive a slow run of the suite.
    expires_in: float | None = 3 * 3600.0,
    secret: str = DEV_JWT_SECRET,
    algorithm: str = "HS256",
    **claims: Any,
) -> str:
    """A player JWT; ``sub=None`` or ``expires_in=None`` leaves that claim out, a negative
    ``expires_in`` makes an expired token, ``algorithm="none"`` an unsigned one."""
    payload: dict[str, Any] = dict(claims)
    if sub is not None:
        payload["sub"] = sub
    if expires_in is not None:
        payload["exp"] = datetime.now(UTC) + timedelta(seconds=expires_in)
    key: str | None = None if algorithm == "none" else secret
    return jwt.encode(payload, key, algorithm=algorithm)


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def player(sub: str = "u-1", **kwargs: Any) -> dict[str, str]:
    """The ``Authorization`` header of a player token (see :func:`player_token`)."""
    return bearer(player_token(sub, **kwargs))


@contextlib.asynccontextmanager
async def api_client(settings: LadderSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The API of ``settings`` run in-process, lifespan and all, and a client of it.

    The lifespan always shuts down gracefully, even when the block fails, so that one failing
    test leaves no connection behind to fail the next. An error inside the app reaches the
    client as the 500 a real client would see.
    """
    manager = LifespanManager(create_app(settings), startup_timeout=15, shutdown_timeout=15)
    await manager.__aenter__()
    try:
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://ladder") as client:
            yield client
    finally:
        await manager.__aexit__(None, None, None)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


@contextlib.asynccontextmanager
async def serve(
    settings: LadderSettings, wrap: Callable[[ASGIApp], ASGIApp] = lambda app: app
) -> AsyncIterator[str]:
    """The API (wrapped in ``wrap``, an ASGI middleware) on a real uvicorn server on a free
    port; its WebSocket URL."""
    port = free_port()
    config = uvicorn.Config(
        wrap(create_app(settings)),
        host="127.0.0.1",
        port=port,
        log_config=None,
        lifespan="on",
        forwarded_allow_ips=list(settings.forwarded_allow_ips),
    )
    async with running(_Server(config)):
        yield f"ws://127.0.0.1:{port}/v1/ws"


async def until_pong(
    ws: websockets.ClientConnection, *ops: dict[str, Any], within: float = 5
) -> list[dict[str, Any]]:
    """Send ``ops`` then a ping: what the socket was sent before the pong, in order, but a
    ``resync``: on a Redis Cluster the hub sends one at any moment a bus link to its node is made
    again (services/api/push/hub.py), which says nothing of what ``ops`` asked for."""
    for op in (*ops, {"op": "ping"}):
        await ws.send(orjson.dumps(op).decode())
    seen = []
    async with asyncio.timeout(within):
        while (message := orjson.loads(await ws.recv()))["type"] != "pong":
            if message["type"] != "resync":
                seen.append(message)
    return seen


class _InProcess(Server):
    settles_heap = False

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def production_server(settings: LadderSettings) -> AsyncIterator[tuple[Server, str]]:
    """The API's own server (``services.api.serving.uvicorn_server``) in this process, and its
    WebSocket URL."""
    port = free_port()
    api = build_server(settings.model_copy(update={"api_port": port}), _InProcess)
    async with running(api):
        yield api, f"ws://127.0.0.1:{port}/v1/ws"


async def derive(
    redis: Redis, keys: Keys, board: Board, events: list[ScoreAccepted], feed_length: int
) -> int:
    """The aggregator's derive step (services.aggregator.derive) for ``events`` of ``board``,
    as a running aggregator applies a batch of the stream: what a test with no aggregator
    running does before it reads a derived view (feed, stats, players, a user's regions and
    team) or merges. Returns how many events were applied now (a redelivery applies none)."""
    derive_step = Derive(redis, keys, None, feed_length)
    call_keys, args = derive_step.call(board, events, rfc3339(datetime.now(UTC)))
    applied, _ = await redis.fcall(DERIVE_FUNCTION, len(call_keys), *call_keys, *args)
    return int(applied)


async def derive_outbox(redis: Redis, keys: Keys, board: Board, feed_length: int) -> int:
    """:func:`derive` for every event in ``board``'s outbox (where they stay in tests whose
    broker is unreachable), in the order the write accepted them."""
    entries: list[Any] = await redis.xrange(keys.outbox(board.board_id))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    return await derive(redis, keys, board, events, feed_length)


async def snapshot(redis: Redis, prefix: str) -> dict[str, tuple[str, Any]]:
    """Every key of a key prefix with its type and whole content, for before/after comparisons.

    Rate-limit buckets (a board's ``{<prefix>:<board>}:rate:*``) are left out: by design every
    submission takes from them, accepted or refused, and an idle one expires.
    """
    found: set[str] = set()
    for pattern in (f"{prefix}:*", "{" + prefix + ":*"):
        found.update([key async for key in redis.scan_iter(match=pattern, count=1000)])
    state: dict[str, tuple[str, Any]] = {}
    for key in sorted(found):
        if key.partition("}")[2].startswith(":rate:"):
            continue
        kind = await redis.type(key)
        content: Any
        if kind == "zset":
            content = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            content = await redis.hgetall(key)
        elif kind == "string":
            # Raw bytes: HyperLogLogs are strings that are not text.
            content = await redis.execute_command("GET", key, NEVER_DECODE=True)
        elif kind == "set":
            content = sorted(await redis.smembers(key))
        elif kind == "list":
            content = await redis.lrange(key, 0, -1)
        elif kind == "stream":
            content = await redis.xrange(key)
        elif kind == "none":  # expired between SCAN and TYPE
            continue
        else:
            raise AssertionError(f"snapshot does not know Redis type {kind!r} of {key}")
        state[key] = (kind, content)
    return state


async def server_statement(server_url: str, statement: str) -> None:
    """One statement on a MySQL server, outside any database (CREATE or DROP DATABASE)."""
    engine = create_async_engine(server_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def catalog_of(redis: Redis, keys: Keys, board_ids: list[str]) -> BoardCatalog:
    """A board catalog that holds a default definition of each of ``board_ids``."""
    catalog = BoardCatalog(redis, keys)
    for board_id in board_ids:
        await catalog.put(Board(board_id=board_id))
    return catalog


async def eventually(probe: Callable[[], Awaitable[T | None]], within: float = 10.0) -> T:
    """The first truthy answer of ``probe``, polled until ``within`` seconds have passed."""
    end = time.monotonic() + within
    while True:
        answer = await probe()
        if answer:
            return answer
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(0.02)


async def tap_fanout(channel: Any, broker_prefix: str) -> tuple[Any, Any]:
    """The scores fanout and a queue of the test's own bound to it: the tap sees exactly what the
    consumers see."""
    exchange = await channel.get_exchange(f"{broker_prefix}.scores")
    tap = await channel.declare_queue(exclusive=True)
    await tap.bind(exchange)
    return exchange, tap


async def republish(exchange: Any, message: Any) -> None:
    """Publish a message taken from the fanout again, exactly as the relay sent it: what a
    broker's redelivery looks like to the consumers."""
    import aio_pika

    await exchange.publish(
        aio_pika.Message(
            message.body,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=message.message_id,
        ),
        routing_key="",
    )


async def read_view(redis: Redis, key: str, descending: bool) -> list[tuple[str, int]]:
    """A ranked view read back as ``(id, score)``, best first (the layout of shared/ranking.py)."""
    rows = await redis.zrevrange(key, 0, -1, withscores=True)
    return [(id_of(m), score_of(s, descending)) for m, s in rows]


async def stored_score(redis: Redis, key: str, entry_id: str, descending: bool) -> int | None:
    """An id's score in a ranked view, found through the view's hash of records, and checked
    against the sorted set that the record's member names."""
    raw = await redis.hget(Keys.ties(key), entry_id)
    if raw is None:
        return None
    tie, signed, _ = parse_record(raw)
    stored = await redis.zscore(key, tie + entry_id)
    assert stored == signed, f"{entry_id}'s record says {signed}, its sorted set {stored}"
    return score_of(stored, descending)


async def global_entry(redis: Redis, keys: Keys, user: str) -> tuple[str, float] | None:
    """A user's all-time global entry on board ``main``: its tie key and stored score."""
    view = keys.global_view("main", "alltime", "all")
    raw = await redis.hget(Keys.ties(view), user)
    tie = None if raw is None else parse_record(raw)[0]
    stored = None if tie is None else await redis.zscore(view, tie + user)
    return None if tie is None or stored is None else (tie, stored)


def dockerfile_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """``dockerfile``'s (INSTRUCTION, arguments) pairs, continuation lines joined, comments
    dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def made(user_id: str, value: int, occurred_at: datetime, *, late_by: float = 0.2) -> ScoreAccepted:
    """An event of no team on board main as the aggregator receives it, accepted ``late_by``
    seconds after it occurred; its periods are left out, as only the hot view reads these."""
    return ScoreAccepted(
        event_id=uuid.uuid4().hex,
        board_id="main",
        user_id=user_id,
        region="eu",
        value=value,
        occurred_at=occurred_at,
        accepted_at=occurred_at + timedelta(seconds=late_by),
        periods={},
    )


@contextlib.contextmanager
def refused_publishes() -> Iterator[None]:
    """Within: every ``PUBLISH`` queued in a pipeline is refused by its Redis node (sent with
    an argument too many: an error reply), while the pipeline's other commands run, as on Redis
    Cluster when the primary of a channel's slot fails and the board's node answers."""

    def refused(pipe: Any, channel: Any, message: Any, **kwargs: Any) -> Any:
        return pipe.execute_command("PUBLISH", channel, message, "refused", **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        for pipeline in (Pipeline, LadderClusterPipeline):
            patch.setattr(pipeline, "publish", refused)
        yield


def assert_waiting_on(health: Any, waiting: Any, dependency: str) -> dict[str, Any]:
    """``/healthz`` and ``/readyz`` of a service waiting at start for ``dependency``: alive,
    not ready, the dependency down and why, in one short line with no URL in it. Returns the
    readiness body."""
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    assert waiting.status_code == 503
    body: dict[str, Any] = waiting.json()
    assert body["status"] == "not ready"
    assert body["dependencies"][dependency] == "down"
    reason = body["reasons"][dependency]
    assert "connect" in reason.lower() and "://" not in reason, reason
    return body


def handles_sigterm() -> bool:
    """Whether this process handles SIGTERM: a service run in it does once it consumes."""
    return signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)


async def sigterm(task: asyncio.Task[None], within: float = 30) -> None:
    """Stop a service run in this process (``task``) as a process manager stops it, with
    SIGTERM, and wait ``within`` seconds for it to end. It must handle SIGTERM already: one sent
    before would end the test run itself."""
    assert handles_sigterm(), "the service does not handle SIGTERM yet"
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(asyncio.shield(task), within)


@contextlib.asynccontextmanager
async def in_process(
    run: Coroutine[Any, Any, None], within: float = 30
) -> AsyncIterator[asyncio.Task[None]]:
    """A service's own run (its main coroutine, ``run``) in this process for the block, then
    stopped within ``within`` seconds: with SIGTERM if it handles it (it consumes), else
    cancelled (it is still opening its dependencies, and a SIGTERM would end the test run)."""
    task = asyncio.create_task(run)
    try:
        yield task
    finally:
        if task.done():
            pass
        elif handles_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, within)


@contextlib.asynccontextmanager
async def consuming(runner: ConsumerRunner, within: float) -> AsyncIterator[None]:
    """``runner`` run for the block, which starts once it consumes (within ``within`` seconds;
    else the queue would hand over what was published before all at once); stopped at the end
    and waited for ``within`` seconds."""
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(within):
            # Polling: the runner has no event for being ready.
            while not runner.ready:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        yield
    finally:
        runner.stop()
        await asyncio.wait_for(task, within)
