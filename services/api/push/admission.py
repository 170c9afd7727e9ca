"""How many WebSockets an API process lets in (docs/api.md section 9).

A process holds at most ``LADDER_WS_MAX`` open sockets, and at most ``LADDER_WS_MAX_PER_IP`` from
one client address. A slot is taken before anything else is looked at (Origin, credential), so
that a handshake past a cap costs the server no more than its refusal, and given back when the
socket ends, whichever way. Past a cap the handshake is refused and the sockets already open
are left alone.

The client address is the one uvicorn puts in the ASGI scope: the TCP peer's, or, when that peer
is one of ``LADDER_FORWARDED_ALLOW_IPS`` (a proxy in front of the API), the address its
``X-Forwarded-For`` names.

The counts are this process's own: ``LADDER_API_WORKERS`` processes on one port admit up to that
many times the caps between them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter

from services.api.errors import Problem

TURNED_AWAY = Counter(
    "ladder_ws_turned_away_total", "WebSocket handshakes refused past a cap", ["cap"]
)

RETRY_AFTER_SECONDS = 5


class TooManySockets(Problem):
    """A handshake past a cap: answered 429, or closed with 1013 where the server cannot send
    an HTTP answer to a WebSocket handshake."""

    status, title, slug = 429, "Too many requests", "too-many-sockets"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class SocketSlots:
    """The open sockets of one process, in all and by client address."""

    def __init__(self, most: int, most_per_address: int) -> None:
        self.most = most
        self.most_per_address = most_per_address
        self.open = 0
        self._by_address: dict[str, int] = {}

    def of(self, address: str) -> int:
        """How many sockets ``address`` holds open here."""
        return self._by_address.get(address, 0)

    @contextmanager
    def held(self, address: str) -> Iterator[None]:
        """A slot for a socket from ``address`` while the block runs; :class:`TooManySockets`
        past a cap, with nothing taken."""
        held = self._by_address.get(address, 0)
        if held >= self.most_per_address:
            TURNED_AWAY.labels("address").inc()
            raise TooManySockets(
                f"This address holds {held} WebSockets here, the most allowed "
                "(LADDER_WS_MAX_PER_IP); close one first."
            )
        if self.open >= self.most:
            TURNED_AWAY.labels("process").inc()
            raise TooManySockets("This server holds all the WebSockets it may; retry shortly.")
        self._by_address[address] = held + 1
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
            left = self._by_address[address] - 1
            if left:
                self._by_address[address] = left
            else:
                del self._by_address[address]
