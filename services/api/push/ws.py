"""The WebSocket at ``/v1/ws`` (docs/api.md section 9).

Each connection is a receiver (client ops) and a sender (its bounded queue) run together; the
first to finish ends both. A client whose queue fills is closed with 1013 and never holds back
the hub or other clients; when the server stops, every socket is closed with 1001. A bad
credential is refused before any subscription is made: the socket is accepted only to be closed
with 1008 and a reason. A socket opened with a player token is closed with 1008 once the token is
past its ``exp`` and the leeway ``authenticate`` grants: a token is checked once, at the
handshake, and a client that stays on reconnects with a fresh one.

Before the server closes a socket, its receiver and sender are stopped: a sender may be waiting
for a peer that stopped reading to make room, and nothing may follow the close frame. The close
itself is given ``CLOSE_WAIT`` seconds; the server's own WebSocket protocol
(``serving/uvicorn_server.py``) sends it at once and drops a peer that does not answer it.

A process admits a bounded number of sockets (``push/admission.py``): past a cap the handshake
is answered 429 where the server can send an HTTP answer to it (the ASGI
``websocket.http.response`` extension, which uvicorn's websockets protocols offer), else
accepted only to be closed with 1013. A topic names a board that exists, and a binary frame is
answered ``error``: each socket's channels are channels of real boards, and a client's mistake
never ends its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

import orjson
import structlog
from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketState

from services.api.auth import ANONYMOUS, Principal, authenticate, bearer
from services.api.errors import Problem, Unauthorized, Unavailable, problem_response
from services.api.push.admission import TooManySockets
from services.api.reads.live import current_hot, current_mvps
from services.api.state import STARTING, ApiState
from shared.boards import BOARD_ID_PATTERN, Board
from shared.events import REGION_PATTERN, USER_ID_PATTERN
from shared.live_maths import HOT_WINDOWS
from shared.periods import PERIODS

log = structlog.get_logger(__name__)
router = APIRouter(tags=["websocket"])

CONNECTIONS = Gauge("ladder_ws_connections", "Open WebSocket connections")
REFUSED = Counter("ladder_ws_refused_total", "Sockets closed at once: bad credential or Origin")

MAX_SUBSCRIPTIONS = 64
MAX_FRAME = 4096
CLOSE_POLICY, CLOSE_GOING_AWAY, CLOSE_TRY_AGAIN = 1008, 1001, 1013
CLOSE_WAIT = 2.0

_BOARD = BOARD_ID_PATTERN.strip("^$")
_LEADERBOARD_TOPIC = re.compile(
    rf"^leaderboard:(?P<board>{_BOARD}):(?P<scope>global|region:{REGION_PATTERN.strip('^$')})"
    rf":(?P<period>{'|'.join(PERIODS)})$"
)
_USER_TOPIC = re.compile(rf"^user:(?P<user>{USER_ID_PATTERN.strip('^$')})$")
# The live views (docs/api.md section 8a): leaderboard:{board}:hot:{10|60},
# leaderboard:{board}:mvps:{period}. A subscriber is sent the view's current state at once,
# then every change.
_LIVE_TOPIC = re.compile(
    rf"^leaderboard:(?P<board>{_BOARD}):(?:hot:(?P<window>{'|'.join(map(str, HOT_WINDOWS))})"
    rf"|mvps:(?P<period>{'|'.join(PERIODS)}))$"
)


class TopicError(Exception):
    pass


class Client:
    """One socket's subscriptions and bounded send queue."""

    def __init__(self, websocket: WebSocket, principal: Principal, state: ApiState) -> None:
        self.websocket = websocket
        self.principal = principal
        self.state = state
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=state.settings.ws_send_queue)
        self.too_slow = asyncio.Event()
        self.topics: dict[str, str] = {}
        # The channels whose current view is being read for a new subscription: whether a push
        # of the channel came meanwhile (subscribe()).
        self.priming: dict[str, bool] = {}
        self.flooding = False

    def deliver(self, text: str, channel: str = "") -> None:
        if channel in self.priming:
            self.priming[channel] = True
        if self.too_slow.is_set():
            return
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            self.too_slow.set()

    def send(self, message: dict[str, object]) -> None:
        self.deliver(orjson.dumps(message).decode())

    async def channel_of(self, topic: str) -> str:
        keys = self.state.keys
        if m := _LEADERBOARD_TOPIC.fullmatch(topic):
            board = await self._check_board(m["board"])
            if m["period"] not in board.periods:
                raise TopicError(f"board {board.board_id!r} keeps no {m['period']} period")
            region = m["scope"].removeprefix("region:")
            if region != m["scope"] and board.regions is not None and region not in board.regions:
                raise TopicError(f"board {board.board_id!r} declares no region {region!r}")
            return keys.board_channel(m["board"], m["scope"], m["period"])
        if m := _LIVE_TOPIC.fullmatch(topic):
            board = await self._check_board(m["board"])
            if m["window"] is not None:
                return keys.board_channel(m["board"], "hot", m["window"])
            # As the mvps read answers: kept only on incr boards, for the board's periods.
            if board.operator != "incr":
                raise TopicError(f"board {board.board_id!r} keeps no MVPs (not an incr board)")
            if m["period"] not in board.periods:
                raise TopicError(f"board {board.board_id!r} keeps no {m['period']} period")
            return keys.board_channel(m["board"], "mvps", m["period"])
        if m := _USER_TOPIC.fullmatch(topic):
            if not self.principal.may_act_for(m["user"]):
                raise TopicError("only that player or a server key may subscribe to it")
            return keys.user_channel(m["user"])
        raise TopicError(
            "unknown topic; use leaderboard:{board}:{scope}:{period}, leaderboard:{board}:hot:"
            "{10|60}, leaderboard:{board}:mvps:{period} or user:{id}"
        )

    async def _check_board(self, board_id: str) -> Board:
        if self.principal.kind == "anonymous" and not self.state.settings.public_reads:
            raise TopicError("leaderboard topics need a credential here")
        board = await self.state.board_lookups.get(self.state.catalog, board_id)
        if board is None:
            raise TopicError(f"there is no board {board_id!r}")
        return board

    async def current_view(self, topic: str) -> str | None:
        """A live view's current state, sent to a new subscriber (None: none, or no live topic):
        the view the aggregator stored, without the users hidden on the board since, as the
        API's reads answer (services/api/reads/live.py)."""
        if (m := _LIVE_TOPIC.fullmatch(topic)) is None:
            return None
        redis, keys = self.state.redis, self.state.keys
        if m["window"] is None:
            return await current_mvps(redis, keys, m["board"], m["period"])
        view = await current_hot(redis, keys, m["board"], int(m["window"]))
        return None if view is None else orjson.dumps(view).decode()

    async def subscribe(self, topic: str) -> None:
        if topic in self.topics:
            return
        if len(self.topics) >= MAX_SUBSCRIPTIONS:
            raise TopicError(f"at most {MAX_SUBSCRIPTIONS} subscriptions per socket")
        channel = await self.channel_of(topic)
        self.topics[topic] = channel
        self.priming[channel] = False
        try:
            await self.state.hub.subscribe(channel, self)
            # Read once the channel is live: any later change arrives as a push after it.
            current = await self.current_view(topic)
        except BaseException:
            # Not subscribed after all: the client's retry must subscribe again, and be sent the
            # view's current state.
            self.priming.pop(channel, None)
            self.unsubscribe(topic)
            raise
        # A push that came while the view was read may be older than what the read found, or
        # newer. Either way the read's view comes as a push too (the aggregator stores a view,
        # then publishes it, and the channel was live before the read): it is sent now only if
        # no push came, so that no view is ever followed by an older one.
        if not self.priming.pop(channel) and current is not None:
            self.deliver(current)

    def unsubscribe(self, topic: str) -> None:
        channel = self.topics.pop(topic, None)
        if channel is not None:
            self.state.hub.unsubscribe(channel, self)

    async def handle(self, raw: str) -> None:
        try:
            op = orjson.loads(raw)
            if not isinstance(op, dict):
                raise ValueError
        except ValueError:
            self.send({"type": "error", "detail": "each message must be a JSON object"})
            return
        kind, topic = op.get("op"), op.get("topic")
        try:
            if kind == "ping":
                self.send({"type": "pong"})
            elif kind in ("subscribe", "unsubscribe") and isinstance(topic, str):
                if kind == "subscribe":
                    await self.subscribe(topic)
                else:
                    self.unsubscribe(topic)
            else:
                raise TopicError("op must be subscribe, unsubscribe (with a topic) or ping")
        except TopicError as exc:
            self.send({"type": "error", "op": kind, "topic": topic, "detail": str(exc)})
        except (TimeoutError, RedisError):
            self.send({"type": "error", "op": kind, "topic": topic, "detail": "try again"})

    async def receive_loop(self) -> None:
        """Client ops in order; returns (to close the socket with 1008) past the message rate."""
        settings = self.state.settings
        bucket = TokenBucket(settings.ws_message_rate, 2 * settings.ws_message_rate)
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000), message.get("reason"))
            if not bucket.take():
                self.flooding = True
                return
            raw = message.get("text")
            if raw is None:
                self.send({"type": "error", "detail": "frames must be text (JSON), not binary"})
                continue
            if len(raw.encode()) > MAX_FRAME:  # bytes, not characters
                self.send({"type": "error", "detail": f"frames are limited to {MAX_FRAME} bytes"})
                continue
            await self.handle(raw)

    async def send_loop(self) -> None:
        while True:
            text = await self.queue.get()
            await self.websocket.send_text(text)


class TokenBucket:
    """A per-socket message budget: ``rate`` a second, bursts of ``burst``. A socket lives in one
    process, so an in-process bucket is the whole truth for it."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def origin_allowed(websocket: WebSocket, allowed: list[str]) -> bool:
    """A browser's ``Origin`` must be listed in ``LADDER_ALLOWED_ORIGINS`` (``*`` allows any) or
    be the API's own origin, so that a page elsewhere cannot ride a visitor's credentials.
    Clients that send no ``Origin`` (game servers, native clients) are not browsers."""
    origin = websocket.headers.get("origin")
    if origin is None or "*" in allowed or origin in allowed:
        return True
    host = websocket.headers.get("host")
    return host is not None and origin in (f"http://{host}", f"https://{host}")


def credential_of(websocket: HTTPConnection) -> str | None:
    """The socket's credential: its ``token`` query parameter (the last, empty or not: an empty
    one is a credential that is not valid, never anonymous) or its ``Authorization`` header.
    Both is a 401 (``Unauthorized``): which one the socket acts with is not left to a rule the
    client may not know, and a header that is not valid is never passed over."""
    token = websocket.query_params.get("token")
    header = websocket.headers.get("authorization")
    if token is not None and header is not None:
        raise Unauthorized(
            "Two credentials: give the token query parameter or the Authorization header."
        )
    return token if token is not None else bearer(header)


class UpgradeRequired(Problem):
    status, title, slug = 426, "Upgrade required", "upgrade-required"


@router.get("/v1/ws", include_in_schema=False)
async def not_upgraded(request: Request) -> None:
    """A plain ``GET`` of the socket's path: a 426 that says what it takes (RFC 9110 section
    15.5.22), where the router answered 404 for a path the contract names; its credential
    judged first, as on every route (401 for one not valid, or for two)."""
    authenticate(credential_of(request), request.state.ladder.settings)
    raise UpgradeRequired(
        "This is the WebSocket endpoint: open it with a WebSocket handshake.",
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},
    )


@router.websocket("/v1/ws")
async def websocket_endpoint(websocket: WebSocket) -> None:
    state: ApiState = websocket.state.ladder
    if not state.opened.is_set():
        await _turn_away(websocket, Unavailable(STARTING))
        return
    address = websocket.client.host if websocket.client is not None else ""
    try:
        async with state.sockets.held(address):
            await _serve(websocket, state)
    except TooManySockets as exc:
        await _turn_away(websocket, exc)


async def _serve(websocket: WebSocket, state: ApiState) -> None:
    # Both checks come before any subscription or other state is made; the socket is
    # accepted only so that the client can read the close code and its reason.
    refusal: str | None = None
    principal = ANONYMOUS
    if not origin_allowed(websocket, state.settings.allowed_origins):
        refusal = "this Origin is not allowed (LADDER_ALLOWED_ORIGINS)"
    else:
        try:
            principal = authenticate(credential_of(websocket), state.settings)
        except Unauthorized as exc:
            refusal = exc.detail
    await websocket.accept()
    if refusal is not None:
        REFUSED.inc()
        await websocket.close(CLOSE_POLICY, reason=refusal[:120])
        return
    client = Client(websocket, principal, state)
    CONNECTIONS.inc()
    tasks: list[asyncio.Task[Any]] = []
    try:
        if principal.kind == "player" and principal.user_id is not None:
            try:
                await client.subscribe(f"user:{principal.user_id}")
            except (TimeoutError, RedisError):
                # Without its own topic the socket would miss the player's pushes unawares.
                await _close(websocket, CLOSE_TRY_AGAIN, "pushes unavailable; try again")
                return
        receiver = asyncio.create_task(client.receive_loop())
        sender = asyncio.create_task(client.send_loop())
        too_slow = asyncio.create_task(client.too_slow.wait())
        going = asyncio.create_task(state.shutting_down.wait())
        tasks = [receiver, sender, too_slow, going]
        expired = _expiry(principal, state.settings.jwt_leeway_seconds)
        if expired is not None:
            tasks.append(expired)
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        await _cancel(tasks)
        if expired in done:
            await _close(websocket, CLOSE_POLICY, "token expired")
        elif receiver in done and client.flooding:
            await _close(websocket, CLOSE_POLICY, "too many messages")
        elif too_slow in done:
            await _close(websocket, CLOSE_TRY_AGAIN, "too slow to keep up")
        elif going in done:
            await _close(websocket, CLOSE_GOING_AWAY, "server shutting down")
    except (WebSocketDisconnect, TimeoutError):
        pass
    finally:
        await _cancel(tasks)
        state.hub.forget(client)
        CONNECTIONS.dec()


def _expiry(principal: Principal, leeway: float) -> asyncio.Task[None] | None:
    """A task that ends when the principal's player token expires, as ``authenticate`` judges
    it (past ``exp`` plus ``leeway``), or None for a credential that does not expire."""
    if principal.expires_at is None:
        return None
    return asyncio.create_task(asyncio.sleep(max(0.0, principal.expires_at + leeway - time.time())))


async def _turn_away(websocket: WebSocket, exc: Problem) -> None:
    """Refuse a handshake past a cap (429), or while the API is starting (503), with its
    problem+json, or where the server cannot answer a handshake over HTTP, accept it only to
    close it with 1013 (try again later)."""
    with contextlib.suppress(Exception):
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(problem_response(exc))
        else:
            await websocket.accept()
            await _close(websocket, CLOSE_TRY_AGAIN, exc.detail[:120])


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(websocket.close(code, reason=reason), CLOSE_WAIT)
