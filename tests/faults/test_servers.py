"""The private servers themselves: a port taken between its choice and the server's first start.

:func:`tests.stack.free_port` only sees a port free at the moment it looks; the server binds it
seconds later. Here the port is taken on purpose in between, by a listening socket of the test,
and the server must come up on another one rather than fail the whole module.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.servers import (
    BASE,
    HOST,
    PORT_TAKEN_SIGNS,
    PREFIX,
    PrivateMariaDB,
    PrivateRabbitMQ,
    PrivateRedis,
    PrivateServer,
)

pytestmark = pytest.mark.faults


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=BASE))
    path.chmod(0o755)  # mariadbd runs as mysql and must pass through
    (path / "owner").write_text(str(os.getpid()))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("kind", [PrivateRedis, PrivateRabbitMQ, PrivateMariaDB])
def test_a_port_taken_before_the_first_start_is_replaced(
    kind: type[PrivateServer], root: Path
) -> None:
    server = kind(root / kind.name)
    taken = server.port
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((HOST, taken))
        holder.listen()
        try:
            server.start()
            assert server.running and server.ready()
            assert server.port != taken
            # The first attempt really met the taken port, and said so in its log.
            said = server.error_log_path.read_text(errors="replace")
            assert any(sign in said for sign in PORT_TAKEN_SIGNS)
            # Later starts keep the new port: the tests' clients hold it.
            chosen = server.port
            server.restart()
            assert server.ready() and server.port == chosen
        finally:
            server.remove()
