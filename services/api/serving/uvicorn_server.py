"""The uvicorn server an API process runs on: a stop that lets clients go in order, and WebSocket
closes that no peer can hold up.

On SIGTERM uvicorn closes every WebSocket itself, with 1012, before the application hears of
the shutdown. :class:`Server` does it in this order instead: the listening socket closes (no new
connection), the application closes each WebSocket with 1001 (going away) and the server waits
up to ``GOING_AWAY_SECONDS`` for every close to be sent; then uvicorn's own shutdown runs:
keep-alive connections close, requests in flight finish (up to the graceful timeout), and the
lifespan ends, which gives the relay its grace period to hand the outbox to the broker.

uvicorn's WebSocket protocol waits for the transport to take more data before sending anything,
a close frame included, and ends an unanswered closing handshake with a graceful close of the
transport, which waits to flush. A peer that stopped reading keeps the transport full, so its
close would never be sent and its connection never end. :class:`WebSocketProtocol` writes the
close frame at once, behind what is already buffered, and aborts the connection (a TCP reset)
if the peer has not answered the close within ``CLOSE_TIMEOUT`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, Any

import orjson
import structlog
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState

from services.api.app import create_app
from services.api.errors import Problem
from services.api.state import ApiState
from shared.heap import settle_heap
from shared.problems import PROBLEM
from shared.settings import LadderSettings

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent, WebSocketCloseEvent

log = structlog.get_logger(__name__)

GOING_AWAY_SECONDS = 2.0
CLOSE_TIMEOUT = 5.0


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, with a close that a peer which stopped reading cannot
    hold up."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_timeout = CLOSE_TIMEOUT

    async def send(self, message: ASGISendEvent) -> None:
        if (
            message["type"] == "websocket.close"
            and self.handshake_complete
            and self.initial_response is None
            and not self.close_sent
        ):
            self._send_close(message)
        else:
            await super().send(message)

    def _send_close(self, message: WebSocketCloseEvent) -> None:
        if self.disconnected:
            raise ClientDisconnected()
        if self.transport.is_closing():
            return
        code, reason = message.get("code", 1000), message.get("reason") or ""
        try:
            self.conn.send_close(code, reason)
        except InvalidState:
            raise ClientDisconnected() from None
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.read_paused:
            # The peer's answer must be read.
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.abort)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.handshake_initiated and self.conn.handshake_exc is not None:
            self._refuse_unreadable_handshake()

    def _refuse_unreadable_handshake(self) -> None:
        """Answer 400 with a problem, and close, a handshake the WebSocket protocol could not
        read: a request line or a header line over ``websockets``' 8192 bytes (a long
        ``?token=`` or ``Authorization``), more than its 128 headers, or no HTTP at all. The
        protocol keeps its own answer to itself and uvicorn waits for a request that never
        comes, so the client would otherwise be left waiting for ever."""
        if self.transport.is_closing():
            return
        problem = Problem(
            "The WebSocket handshake cannot be read: a request line or header line over 8192 "
            "bytes, or more than 128 headers."
        )
        body = orjson.dumps(problem.body())
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: "
            + PROBLEM.encode()
            + b"\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + body
        )
        self.handshake_initiated = self.handshake_complete = self.close_sent = True
        self.transport.close()

    def keepalive_timeout(self) -> None:
        # uvicorn sends 1011 and closes gracefully, which a peer that stopped reading holds up.
        super().keepalive_timeout()
        if self.close_timer is None and not self.disconnected:
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.abort)

    def shutdown(self) -> None:
        if self.close_sent and self.close_timer is not None:
            # The application's close (1001) is on its way: the peer's answer ends the
            # connection, or the close timer does.
            self.stop_keepalive()
            return
        super().shutdown()


class Server(uvicorn.Server):
    # Whether the process's collector is settled once the server has started (shared/heap.py):
    # the API's own process, yes; a server run inside another program (the tests) leaves that
    # program's collector as it is.
    settles_heap = True
    # Whether the application failed to open Redis, which stopped the server.
    failed_to_open = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.settles_heap:
            settle_heap()

    async def on_tick(self, counter: int) -> bool:
        # The application serves while it waits for a Redis that did not answer at start
        # (services/api/app.py); an opening that then fails (a database the Redis server has
        # not) stops the server, as a failed start does.
        ladder = self.lifespan.state.get("ladder")
        if isinstance(ladder, ApiState) and ladder.failure is not None:
            self.failed_to_open = True
            return True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for listener in self.servers:
            listener.close()
        ladder = self.lifespan.state.get("ladder")
        if isinstance(ladder, ApiState):
            log.info("going away: WebSockets close with 1001")
            ladder.shutting_down.set()
            await self._websockets_closed(GOING_AWAY_SECONDS)
        await super().shutdown(sockets)

    async def _websockets_closed(self, within: float) -> None:
        """Until each WebSocket has sent its close or gone, for at most ``within`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        # uvicorn has no event for it and watches its connections by polling too.
        while loop.time() < deadline and any(  # noqa: ASYNC110
            isinstance(c, WebSocketsSansIOProtocol) and not (c.close_sent or c.disconnected)
            for c in self.server_state.connections
        ):
            await asyncio.sleep(0.02)


def build_server(settings: LadderSettings, server_class: type[Server] = Server) -> Server:
    """The API's server, as ``python -m services.api`` runs it."""
    config = uvicorn.Config(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        loop="uvloop",
        http="httptools",
        ws=WebSocketProtocol,
        ws_max_size=64 * 1024,
        # The client address (WebSocket caps per address) is the TCP peer's, or, where the peer
        # is a listed proxy, what its X-Forwarded-For names (docs/security.md).
        proxy_headers=True,
        forwarded_allow_ips=list(settings.forwarded_allow_ips),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_seconds)),
    )
    return server_class(config)


def serve(settings: LadderSettings, sockets: list[socket.socket] | None = None) -> int:
    """Run one API process until it is stopped; its exit status."""
    server = build_server(settings)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)
    return 0 if server.started and not server.failed_to_open else STARTUP_FAILURE
