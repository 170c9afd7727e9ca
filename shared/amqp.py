"""Connections to a RabbitMQ broker of one node or of several (a cluster).

``LADDER_AMQP_URL`` names one node, or every node of a cluster as a comma-separated list
(:attr:`shared.settings.LadderSettings.amqp_urls`). Every AMQP client of Ladder connects
through this module:

- :func:`connect_robust` gives a long-lived connection that reconnects by itself (the
  consumers, the outbox relay, the period relay, the simulator's control listener). It
  connects to the first address in the list that answers. Once connected, a lost connection, or
  a reconnection attempt that fails, moves it on to the next address in the list (round the
  list, for as long as it takes), so that a client whose node stopped lands on a live one
  within one ``reconnect_interval`` or so instead of knocking at the stopped node's door. Its
  channels, queues and consumers are restored there as aio-pika's ``RobustConnection`` always
  restores them.
- :func:`connect` gives a plain connection to the first address that answers (scripts, the
  simulator's ``set`` command, tests).

Each connection logs the address it connected to (``broker connected``, ``node=host:port``).
With one address both behave as ``aio_pika.connect_robust`` and ``aio_pika.connect`` do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import structlog
from aio_pika.abc import AbstractConnection
from aio_pika.connection import make_url
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aio_pika.robust_connection import RobustConnection
from pamqp.common import FieldTable

log = structlog.get_logger(__name__)

ATTEMPT_SECONDS = 10.0
"""How long one connection attempt to one address may take before the next is tried."""


def node_of(url: object) -> str:
    """``host:port`` of an AMQP address (never its credentials)."""
    parts = urlsplit(str(url))
    default = 5671 if parts.scheme == "amqps" else 5672
    return f"{parts.hostname}:{parts.port or default}"


def _name(client_properties: FieldTable | None) -> str:
    return str((client_properties or {}).get("connection_name", ""))


class NodesConnection(RobustConnection):
    """A ``RobustConnection`` that knows every node's address and reconnects to the next one.

    aio-pika's ``RobustConnection`` retries the one URL it was made with. Both a lost
    connection and a failed connection attempt pass through ``_on_connection_close`` (the
    attempt's failure is reported to it as the closing of a connection that never opened), so
    that is where this class moves ``url`` on to the next address; the reconnection loop reads
    ``url`` afresh at every attempt. Both are aio-pika 10's behaviour (the pinned version), which
    tests/shared/test_amqp.py checks. Options aio-pika itself reads from an address's query
    string (``reconnect_interval``, ``fail_fast``) are taken from the first address tried; those
    of the AMQP client underneath (``heartbeat``, TLS files) from each address as it is tried.
    """

    def __init__(self, urls: Sequence[str], first: int = 0, **kwargs: Any) -> None:
        if not urls:
            raise ValueError("no AMQP address to connect to")
        self.urls = [make_url(url) for url in urls]
        self.index = first % len(self.urls)
        super().__init__(self.urls[self.index], **kwargs)

    @property
    def node(self) -> str:
        """``host:port`` of the address in use (or being tried)."""
        return node_of(self.url)

    def _advance(self) -> None:
        if len(self.urls) == 1:
            return
        before = self.node
        self.index = (self.index + 1) % len(self.urls)
        self.url = self.urls[self.index]
        log.info("broker connection: next node", lost=before, next=self.node)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        await super()._on_connection_close(closing)
        # Before the first connection, connect_robust itself tries the addresses in turn.
        if self.connection_attempt and not (self._close_called or self.is_closed):
            self._advance()

    async def _on_connected(self) -> None:
        await super()._on_connected()
        log.info(
            "broker connected",
            node=self.node,
            connection=_name(self.kwargs.get("client_properties")),
            of_nodes=len(self.urls),
        )


async def connect_robust(
    urls: Sequence[str],
    *,
    client_properties: FieldTable | None = None,
    reconnect_interval: float = 5.0,
    attempt_seconds: float = ATTEMPT_SECONDS,
) -> NodesConnection:
    """A robust connection to the first of ``urls`` that answers; it reconnects to the next
    ones in turn whenever its connection is lost. Raises the last failure if none answers."""
    if not urls:
        raise ValueError("no AMQP address to connect to")
    failures: list[BaseException] = []
    for first in range(len(urls)):
        connection = NodesConnection(
            urls,
            first,
            client_properties=client_properties,
            reconnect_interval=reconnect_interval,
        )
        try:
            await connection.connect(timeout=attempt_seconds)
        except CONNECTION_EXCEPTIONS as exc:
            failures.append(exc)
            log.warning("broker node unavailable", node=node_of(urls[first]), error=repr(exc))
            with contextlib.suppress(Exception):
                await connection.close()
            continue
        return connection
    raise failures[-1]


async def connect(
    urls: Sequence[str],
    *,
    client_properties: FieldTable | None = None,
    attempt_seconds: float = ATTEMPT_SECONDS,
) -> AbstractConnection:
    """A plain connection to the first of ``urls`` that answers; raises the last failure if
    none does."""
    if not urls:
        raise ValueError("no AMQP address to connect to")
    failures: list[BaseException] = []
    for url in urls:
        try:
            return await aio_pika.connect(
                url, client_properties=client_properties, timeout=attempt_seconds
            )
        except CONNECTION_EXCEPTIONS as exc:
            failures.append(exc)
            log.warning("broker node unavailable", node=node_of(url), error=repr(exc))
    raise failures[-1]
