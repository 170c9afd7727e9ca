"""The WebSocket's controls, tried as an attacker would (docs/api.md sections 2 and 9)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from types import SimpleNamespace
from typing import Any, cast

import jwt
import pytest
import websockets
from redis.asyncio import Redis
from websockets.exceptions import ConnectionClosed

from services.api.auth import Principal, authenticate
from services.api.push.ws import MAX_SUBSCRIPTIONS, Client
from shared.boards import Board, BoardCatalog
from shared.keys import Keys
from shared.settings import DEV_SERVER_KEY, LadderSettings
from shared.topology import Topology
from tests.api.test_pubsub import hub_connections
from tests.helpers import api_client, eventually, player_token, production_server, serve

pytestmark = pytest.mark.usefixtures("mysql_database")

TOPIC = "leaderboard:main:global:weekly"


async def close_code(url: str, **kwargs: Any) -> tuple[int | None, str]:
    """Connect and wait for the server to close; the code and reason it closed with."""
    async with websockets.connect(url, **kwargs) as ws:
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(5):
                while True:
                    await ws.recv()
        assert ws.close_code is not None
        return ws.close_code, ws.close_reason or ""


async def ask(ws: websockets.ClientConnection, op: dict[str, Any]) -> dict[str, Any]:
    """Send an op, then a ping: the answers that came before the pong."""
    await ws.send(json.dumps(op))
    await ws.send(json.dumps({"op": "ping"}))
    answers = []
    async with asyncio.timeout(5):
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == "pong":
                break
            answers.append(message)
    assert len(answers) <= 1, answers
    return answers[0] if answers else {"type": "ok"}


@pytest.mark.parametrize(
    "token",
    [
        "not-a-key",
        player_token("u-1", expires_in=-60),
        player_token("u-1", secret="another-secret-of-at-least-32-bytes!"),
        player_token("u-1", algorithm="none"),
        player_token(None),
        player_token("u-1", expires_in=None),
        player_token("u-1\n"),
    ],
    ids=["unknown-key", "expired", "forged", "unsigned", "no-sub", "no-exp", "sub-past-its-id"],
)
async def test_a_bad_credential_is_closed_with_1008(
    quiet: LadderSettings, redis: Redis, broker: Topology, token: str
) -> None:
    async with serve(quiet) as url:
        code, reason = await close_code(f"{url}?token={token}")
    assert code == 1008
    assert reason


async def handshake_answer(
    url: str, target: bytes, headers: bytes = b"", until: bytes | None = None
) -> bytes:
    """Send a WebSocket handshake by hand; what the server sent within 5 s, or until it closed
    the connection, or until what it sent holds ``until``."""
    host, _, port = url.removeprefix("ws://").partition("/")[0].partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET " + target + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n" + headers + b"\r\n"
    )
    sent = b""
    try:
        async with asyncio.timeout(5):
            while chunk := await reader.read(65536):
                sent += chunk
                if until is not None and until in sent:
                    break
    except TimeoutError:
        pass
    finally:
        writer.close()
    return sent


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        (b"/v1/ws?token=" + b"a" * 9000, b""),
        (b"/v1/ws", b"Authorization: Bearer " + b"a" * 9000 + b"\r\n"),
        (b"/v1/ws", b"".join(b"X-Pad-%d: 1\r\n" % i for i in range(130))),
    ],
    ids=["token-past-the-line-limit", "header-past-the-line-limit", "too-many-headers"],
)
async def test_a_handshake_too_large_to_read_is_answered_400_not_left_hanging(
    quiet: LadderSettings, redis: Redis, broker: Topology, target: bytes, headers: bytes
) -> None:
    """A handshake whose request line or a header line passes 8192 bytes, or with more than 128
    headers, cannot be read by the WebSocket protocol: it is answered 400 with a problem and the
    connection closed, where it was left waiting for ever. A token just under the line limit is
    read, and refused as a bad credential is."""
    async with production_server(quiet) as (_, url):
        answer = await handshake_answer(url, target, headers)
        under = await handshake_answer(url, b"/v1/ws?token=" + b"a" * 8000, until=b"valid key")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:200] or "no answer"
    assert b"content-type: application/problem+json" in head.lower()
    problem = json.loads(body)
    assert (problem["status"], problem["type"]) == (400, "https://ladder.dev/problems/bad-request")
    assert under.startswith(b"HTTP/1.1 101 ") and b"not a valid key" in under


@pytest.mark.parametrize("query", ["token=", "token=not-a-key&token="])
async def test_an_empty_token_is_a_bad_credential_not_none(
    quiet: LadderSettings, redis: Redis, broker: Topology, query: str
) -> None:
    """A ``token`` that is there is a credential, empty or not: never an anonymous socket (nor
    may an empty one after a bad one drop it), as a blank Authorization header is a 401."""
    async with serve(quiet) as url:
        code, reason = await close_code(f"{url}?{query}")
    assert code == 1008, reason


async def test_a_foreign_origin_is_refused(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    allowed = quiet.model_copy(update={"allowed_origins": ["https://game.example"]})
    async with serve(allowed) as url:
        code, reason = await close_code(url, origin="https://evil.example")
        assert (code, "Origin" in reason) == (1008, True)
        # Listed origins, the API's own origin, and clients sending none are let in.
        host = url.removeprefix("ws://").removesuffix("/v1/ws")
        for origin in ("https://game.example", f"http://{host}", None):
            async with websockets.connect(url, origin=origin) as ws:  # type: ignore[arg-type]
                assert (await ask(ws, {"op": "ping"}))["type"] == "ok"


async def test_players_may_not_listen_to_others(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    async with serve(quiet) as url:
        async with websockets.connect(f"{url}?token={player_token('u-1')}") as ws:
            refused = await ask(ws, {"op": "subscribe", "topic": "user:u-2"})
            assert refused["type"] == "error" and refused["topic"] == "user:u-2"
            # The socket stays usable: its own topic and boards are fine.
            assert (await ask(ws, {"op": "subscribe", "topic": "user:u-1"}))["type"] == "ok"
            topic = "leaderboard:main:global:weekly"
            assert (await ask(ws, {"op": "subscribe", "topic": topic}))["type"] == "ok"
        async with websockets.connect(url) as anonymous:
            refused = await ask(anonymous, {"op": "subscribe", "topic": "user:u-1"})
            assert refused["type"] == "error"
        async with websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as server:
            assert (await ask(server, {"op": "subscribe", "topic": "user:u-2"}))["type"] == "ok"


def test_a_player_principal_carries_its_tokens_exp(quiet: LadderSettings) -> None:
    token = player_token("u-1")
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    assert authenticate(token, quiet) == Principal("player", "u-1", float(exp))
    assert authenticate(DEV_SERVER_KEY, quiet).expires_at is None
    assert authenticate(None, quiet).expires_at is None
    # An exp too large for a float is as good as never, not a fault.
    far = player_token("u-1", expires_in=None, exp=10**400)
    assert authenticate(far, quiet).expires_at == 2.0**53


async def test_a_player_socket_is_closed_once_its_token_expires(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    """The token is checked at the handshake, and its exp (plus the leeway) still ends the
    socket: closed with 1008, pushed nothing more, its subscriptions dropped. A server key's
    socket on the same topic lives on."""
    leeway = 0.2
    settings = quiet.model_copy(update={"jwt_leeway_seconds": leeway})
    channel = Keys(quiet.key_prefix).user_channel("u-1")
    token = player_token("u-1", expires_in=2)
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    async with (
        serve(settings) as url,
        websockets.connect(f"{url}?token={token}") as player,
        websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as server,
    ):
        assert (await ask(server, {"op": "subscribe", "topic": "user:u-1"}))["type"] == "ok"
        assert (await ask(player, {"op": "subscribe", "topic": TOPIC}))["type"] == "ok"
        await redis.publish(channel, json.dumps({"type": "badge", "n": 0}))
        for ws in (player, server):
            async with asyncio.timeout(5):
                assert json.loads(await ws.recv()) == {"type": "badge", "n": 0}

        received = []
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(exp + leeway + 3 - time.time()):
                while True:
                    received.append(await player.recv())
        assert time.time() >= exp + leeway
        assert (player.close_code, player.close_reason, received) == (1008, "token expired", [])

        await redis.publish(channel, json.dumps({"type": "badge", "n": 1}))
        async with asyncio.timeout(5):
            assert json.loads(await server.recv()) == {"type": "badge", "n": 1}
        assert (await ask(server, {"op": "ping"}))["type"] == "ok"
        # Only the server socket's user:u-1 is left on the hub's connection.
        name = f"ladder-hub-{quiet.key_prefix}"

        async def only_the_servers() -> bool:
            return [hub["sub"] for hub in await hub_connections(redis, name)] == ["1"]

        await eventually(only_the_servers, within=5)


@pytest.mark.parametrize(
    "message",
    [
        "not json",
        "[1, 2]",
        '{"op": "subscribe"}',
        '{"op": "subscribe", "topic": 7}',
        '{"op": "explode", "topic": "user:u-1"}',
        '{"op": "subscribe", "topic": "leaderboard:main:global:hourly"}',
        '{"op": "subscribe", "topic": "leaderboard:MAIN:global:weekly"}',
        '{"op": "subscribe", "topic": "user:../../etc"}',
        json.dumps({"op": "subscribe", "topic": "user:" + "x" * 5000}),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "no-topic",
        "topic-not-a-string",
        "unknown-op",
        "unknown-period",
        "bad-board-id",
        "bad-user-id",
        "oversized-frame",
    ],
)
async def test_hostile_messages_answer_an_error_and_the_socket_lives_on(
    quiet: LadderSettings, redis: Redis, broker: Topology, message: str
) -> None:
    async with serve(quiet) as url, websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as ws:
        await ws.send(message)
        answer = json.loads(await ws.recv())
        assert answer["type"] == "error" and answer["detail"]
        assert (await ask(ws, {"op": "ping"}))["type"] == "ok"


async def test_subscriptions_per_socket_are_bounded(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    chatty = quiet.model_copy(update={"ws_message_rate": 1000.0})
    async with serve(chatty) as url, websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as ws:
        for i in range(MAX_SUBSCRIPTIONS):
            assert (await ask(ws, {"op": "subscribe", "topic": f"user:u-{i}"}))["type"] == "ok"
        refused = await ask(ws, {"op": "subscribe", "topic": "user:one-too-many"})
        assert refused["type"] == "error" and str(MAX_SUBSCRIPTIONS) in refused["detail"]
        # Unsubscribing makes room again.
        assert (await ask(ws, {"op": "unsubscribe", "topic": "user:u-0"}))["type"] == "ok"
        assert (await ask(ws, {"op": "subscribe", "topic": "user:u-new"}))["type"] == "ok"


async def test_a_flooding_client_is_closed(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    slow = quiet.model_copy(update={"ws_message_rate": 5.0})
    async with serve(slow) as url, websockets.connect(f"{url}?token={DEV_SERVER_KEY}") as ws:
        with contextlib.suppress(ConnectionClosed):
            for _ in range(100):
                await ws.send(json.dumps({"op": "ping"}))
            async with asyncio.timeout(5):
                while True:
                    await ws.recv()
        assert ws.close_code == 1008
        assert "too many" in (ws.close_reason or "")


@pytest.mark.parametrize(
    "topic",
    [
        "leaderboard:no-such-board:global:weekly",
        "leaderboard:no-such-board:region:eu:daily",
        "leaderboard:no-such-board:hot:10",
        "leaderboard:no-such-board:mvps:weekly",
    ],
)
async def test_a_topic_of_a_board_that_does_not_exist_answers_an_error(
    quiet: LadderSettings, redis: Redis, broker: Topology, topic: str
) -> None:
    name = f"ladder-hub-{quiet.key_prefix}"
    async with serve(quiet) as url, websockets.connect(url) as ws:
        refused = await ask(ws, {"op": "subscribe", "topic": topic})
        assert refused["type"] == "error" and refused["topic"] == topic
        assert "no board" in refused["detail"]
        # No channel was made for it, and the socket lives on: a real board's topic is fine.
        assert await hub_connections(redis, name) == []
        assert (await ask(ws, {"op": "subscribe", "topic": TOPIC}))["type"] == "ok"
        [hub] = await hub_connections(redis, name)
        assert hub["sub"] == "1"


async def test_a_binary_frame_answers_an_error_and_the_socket_lives_on(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    channel = Keys(quiet.key_prefix).board_channel("main", "global", "weekly")
    async with serve(quiet) as url, websockets.connect(url) as ws:
        assert (await ask(ws, {"op": "subscribe", "topic": TOPIC}))["type"] == "ok"
        await ws.send(b'{"op": "ping"}')
        answer = json.loads(await ws.recv())
        assert answer["type"] == "error" and "binary" in answer["detail"]
        await ws.send(json.dumps({"op": "ping"}))
        assert json.loads(await ws.recv()) == {"type": "pong"}
        # Still subscribed, still pushed to.
        await redis.publish(channel, json.dumps({"type": "leaderboard", "n": 1}))
        async with asyncio.timeout(5):
            assert json.loads(await ws.recv()) == {"type": "leaderboard", "n": 1}


async def test_a_topic_of_an_undeclared_region_or_a_period_not_kept_answers_an_error(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    """A real board's topics are bounded too: a region it does not declare, a period it does
    not keep, answer ``error`` and make no channel."""
    catalog = BoardCatalog(redis, Keys(quiet.key_prefix))
    await catalog.put(
        Board(board_id="declared", operator="best", periods=("daily",), regions=("eu",))
    )
    await catalog.put(Board(board_id="counted", periods=("daily",)))  # incr, the default
    name = f"ladder-hub-{quiet.key_prefix}"
    async with serve(quiet) as url, websockets.connect(url) as ws:
        for topic, said in [
            ("leaderboard:declared:region:na:daily", "declares no region 'na'"),
            ("leaderboard:declared:global:weekly", "keeps no weekly period"),
            ("leaderboard:declared:region:eu:alltime", "keeps no alltime period"),
            # MVPs as the mvps read keeps them: on incr boards, for the board's periods.
            ("leaderboard:declared:mvps:daily", "keeps no MVPs"),
            ("leaderboard:counted:mvps:weekly", "keeps no weekly period"),
            ("leaderboard:declared:global:daily\n", "unknown topic"),
        ]:
            refused = await ask(ws, {"op": "subscribe", "topic": topic})
            assert refused["type"] == "error" and said in refused["detail"], refused
        assert await hub_connections(redis, name) == []
        for topic in [
            "leaderboard:declared:region:eu:daily",
            "leaderboard:declared:global:daily",
            "leaderboard:counted:mvps:daily",
        ]:
            assert (await ask(ws, {"op": "subscribe", "topic": topic}))["type"] == "ok"
        [hub] = await hub_connections(redis, name)
        assert hub["sub"] == "3"


async def test_the_frame_limit_counts_bytes(
    quiet: LadderSettings, redis: Redis, broker: Topology
) -> None:
    # 3,000 characters of two bytes each: under 4,096 characters, over 4,096 bytes.
    frame = json.dumps({"op": "ping", "pad": "é" * 3000}, ensure_ascii=False)
    async with serve(quiet) as url, websockets.connect(url) as ws:
        await ws.send(frame)
        answer = json.loads(await ws.recv())
        assert answer["type"] == "error" and "4096 bytes" in answer["detail"]
        await ws.send(json.dumps({"op": "ping"}))
        assert json.loads(await ws.recv()) == {"type": "pong"}


async def test_a_subscribe_that_fails_midway_leaves_no_subscription() -> None:
    """The hub's channel not live in time (Redis away): the answer is an error, nothing stays
    subscribed, and a retry subscribes again rather than being taken for a repeat."""

    class AwayHub:
        def __init__(self) -> None:
            self.wanted: set[str] = set()

        async def subscribe(self, channel: str, subscriber: object) -> None:
            self.wanted.add(channel)
            raise TimeoutError

        def unsubscribe(self, channel: str, subscriber: object) -> None:
            self.wanted.discard(channel)

    hub = AwayHub()
    state: Any = SimpleNamespace(
        settings=SimpleNamespace(ws_send_queue=8), hub=hub, keys=Keys("lt-ws-unit")
    )
    client = Client(cast(Any, None), Principal("server"), state)
    for _ in range(2):
        await client.handle(json.dumps({"op": "subscribe", "topic": "user:u-1"}))
        answer = json.loads(client.queue.get_nowait())
        assert answer["type"] == "error" and answer["detail"] == "try again", answer
        assert client.topics == {} and hub.wanted == set()


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("not-a-key", DEV_SERVER_KEY),
        (DEV_SERVER_KEY, "not-a-key"),
        (DEV_SERVER_KEY, DEV_SERVER_KEY),
    ],
    ids=["bad-header-good-token", "good-header-bad-token", "both-good"],
)
async def test_a_handshake_with_two_credentials_is_closed_with_1008(
    quiet: LadderSettings, redis: Redis, broker: Topology, header: str, token: str
) -> None:
    """A header and a ``token`` both: the socket acted with the token, passing over a header
    that was not valid, a rule a client could not know; now neither is chosen."""
    async with serve(quiet) as url:
        code, reason = await close_code(
            f"{url}?token={token}", additional_headers={"Authorization": f"Bearer {header}"}
        )
    assert code == 1008
    assert reason.startswith("Two credentials")


async def test_a_plain_get_of_the_socket_path_is_a_426_that_says_so(quiet: LadderSettings) -> None:
    """Not a 404 "Not Found" for the path the contract names: what it takes, with ``Upgrade``."""
    async with api_client(quiet) as client:
        answer = await client.get("/v1/ws", params={"token": DEV_SERVER_KEY})
    assert answer.status_code == 426, answer.text
    assert answer.headers["upgrade"] == "websocket"
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert "WebSocket handshake" in answer.json()["detail"]
    # Its credential judged first, as on every route of /v1/.
    async with api_client(quiet) as client:
        bad = await client.get("/v1/ws", headers={"Authorization": "Bearer not-a-key"})
        two = await client.get(
            "/v1/ws", params={"token": DEV_SERVER_KEY}, headers={"Authorization": "Bearer x"}
        )
    assert (bad.status_code, two.status_code) == (401, 401)
