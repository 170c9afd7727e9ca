"""A server outage for one test, without touching the server: a TCP relay in front of it that the
test cuts (every connection dropped, new ones refused: what clients see of a server that went
down) and restores, on the same port. The shared Redis, MariaDB and RabbitMQ keep running for
everyone else."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from shared.redis_cluster import LadderCluster
from shared.settings import LadderSettings
from tests.stack import free_port


class Outage:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def through(self, url: str) -> str:
        """``url`` (of the server this relays to) with its host and port the relay's."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")
        return urlunsplit(
            parts._replace(netloc=f"{credentials[0]}{credentials[1]}127.0.0.1:{self.port}")
        )

    async def restore(self) -> None:
        """Listen (again): connections reach the server."""
        self._server = await asyncio.start_server(
            self._link, "127.0.0.1", self.port, reuse_address=True
        )

    async def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    async def _link(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        self._writers.add(client_out)
        try:
            server_in, server_out = await asyncio.open_connection(*self.target)
        except OSError:
            client_out.transport.abort()
            self._writers.discard(client_out)
            return
        self._writers.add(server_out)
        pumps = [
            asyncio.create_task(self._pump(client_in, server_out)),
            asyncio.create_task(self._pump(server_in, client_out)),
        ]
        self._links.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._links.discard(pump)
            for writer in (client_out, server_out):
                writer.transport.abort()
                self._writers.discard(writer)

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()


@contextlib.asynccontextmanager
async def relayed(host: str, port: int) -> AsyncIterator[Outage]:
    """An :class:`Outage` in front of ``host:port``, up for the block, gone afterwards."""
    outage = Outage(host, port)
    await outage.restore()
    try:
        yield outage
    finally:
        await outage.cut()


class RedisOutage:
    """The tests' Redis away for a client of ``url``: one relay in front of one Redis, or one in
    front of every node of a cluster, whose addresses a cluster client of ``url`` is given
    remapped to the relays' (redis-py's ``address_remap``), so that it reaches no node but
    through them. Other clients, the test's own, reach the servers as before."""

    def __init__(self, relays: dict[int, Outage], url: str) -> None:
        self.relays = relays
        self.url = url

    async def cut(self) -> None:
        for relay in self.relays.values():
            await relay.cut()

    async def restore(self) -> None:
        for relay in self.relays.values():
            await relay.restore()

    def remap(self, address: tuple[str, int]) -> tuple[str, int]:
        relay = self.relays.get(address[1])
        return address if relay is None else ("127.0.0.1", relay.port)


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The address of every node of the cluster of ``url``, as ``CLUSTER NODES`` gives them."""
    with redis.Redis.from_url(url, socket_timeout=5, decode_responses=True) as client:
        listing: dict[str, Any] = client.execute_command("CLUSTER NODES")
    found = []
    for address in listing:
        host, _, port = address.rpartition(":")
        found.append((host, int(port)))
    return found


@contextlib.asynccontextmanager
async def redis_relayed(
    settings: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RedisOutage]:
    """A :class:`RedisOutage` of the settings' Redis, up for the block, gone afterwards."""
    target = urlsplit(settings.redis_url)
    host, port = target.hostname or "127.0.0.1", target.port or 6379
    nodes = cluster_nodes(settings.redis_url) if settings.redis_cluster else [(host, port)]
    relays = {node_port: Outage(node_host, node_port) for node_host, node_port in nodes}
    url = urlunsplit(target._replace(netloc=f"127.0.0.1:{relays[port].port}"))
    outage = RedisOutage(relays, url)
    if settings.redis_cluster:
        made = LadderCluster.__init__
        relayed_ports = {relay.port for relay in relays.values()}

        def remapped(self: LadderCluster, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("port") in relayed_ports:
                kwargs["address_remap"] = outage.remap
            made(self, *args, **kwargs)

        monkeypatch.setattr(LadderCluster, "__init__", remapped)
    await outage.restore()
    try:
        yield outage
    finally:
        await outage.cut()
