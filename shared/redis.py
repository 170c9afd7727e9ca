"""Redis connections and the Ladder function library."""

from __future__ import annotations

import asyncio
import contextlib
import re
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from importlib import resources
from typing import Any, cast

import hiredis
import structlog
from redis.asyncio import BlockingConnectionPool, Connection, ConnectionPool, Redis
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import HIREDIS_AVAILABLE

from shared.functions import FORGET_CONSUMERS_FUNCTION, LIBRARY, REGISTERED
from shared.redis_cluster import LadderCluster, seed_nodes
from shared.settings import SettingsError

log = structlog.get_logger(__name__)

# The library's files in load order: common.lua first (what the others use), then each concern;
# a file may use the local functions of those before it.
LUA_FILES = (
    "common",
    "brackets",
    "write",
    "limits",
    "lease",
    "combine",
    "merge",
    "tops",
    "dense",
    "hide",
    "hot",
    "live",
    "derive",
    "badges",
    "rebuild",
    "read",
    "periods",
    "relay",
    "erase",
    "trim",
)
# A process's connections to one Redis, and how long a call waits for one of them when all are
# in use (a burst of requests behind a slow command) before it fails as Redis being unavailable
# (503). redis-py's own pool failed a call at once past its 100 connections.
POOL_SIZE = 100
POOL_WAIT = 5.0
_LUA_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_REGISTERS = re.compile(r"redis\.register_function\W+(?:function_name = )?FUNCTIONS\.(\w+)")


class PackedConnection(Connection):
    """A TCP connection that packs commands with hiredis, as redis-py's synchronous client does
    when hiredis is installed; its asyncio client packs them in Python, which on a write's
    ninety arguments costs more than the rest of the request's Redis client work."""

    _serializer = HiredisRespSerializer() if HIREDIS_AVAILABLE else None

    def pack_command(self, *args: Any) -> list[bytes]:
        if self._serializer is None:
            return super().pack_command(*args)
        # The asyncio client's encoder turns every argument into bytes; hiredis takes str,
        # bytes, int and float as they are, encoding str as UTF-8 (the encoder's default).
        return [_packed(self._serializer, args)]

    def pack_commands(self, commands: Any) -> list[bytes]:
        if self._serializer is None:
            return super().pack_commands(commands)
        serializer = self._serializer
        return [b"".join(_packed(serializer, tuple(command)) for command in commands)]

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        """redis-py's send, without a task a command: it bounds the whole send by the socket
        timeout with ``asyncio.wait_for``, which makes a task of the send and waits a turn of
        the event loop for it (10 µs of CPU of a read's 63 in ``execute_command``). Here the
        bytes go to the transport at once, as they did in that task, and the timeout bounds what
        can wait: the transport draining its buffer to the socket. Its failures are
        redis-py's."""
        if not self.is_connected:
            await self.connect_check_health(check_health=False)
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]
        try:
            if isinstance(command, str):
                command = command.encode()
            if isinstance(command, bytes):
                command = [command]
            writer = self._writer
            assert writer is not None
            writer.writelines(command)
            # A drain waits only while the transport holds more than its high-water mark; with
            # nothing left in it, there is nothing to wait for and no timer to set.
            if self.socket_timeout and writer.transport.get_write_buffer_size():
                async with asyncio.timeout(self.socket_timeout):
                    await writer.drain()
            else:
                await writer.drain()
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)
            if len(e.args) == 1:
                err_no, errmsg = "UNKNOWN", e.args[0]
            else:
                err_no = e.args[0]
                errmsg = e.args[1]
            raise RedisConnectionError(f"Error {err_no} while writing to socket. {errmsg}.") from e
        except BaseException:
            await self.disconnect(nowait=True)
            raise


def _packed(serializer: HiredisRespSerializer, args: tuple[Any, ...]) -> bytes:
    """``args`` packed by hiredis itself: the serializer's pass over every argument (for
    memoryviews, and command names of two words) costs as much as the packing on a write's
    ninety arguments, so it is left to the commands that need it."""
    if isinstance(args[0], str) and " " not in args[0]:
        with contextlib.suppress(TypeError):  # a memoryview or bytearray argument
            return hiredis.pack_command(args)  # type: ignore[no-any-return]
    packed: bytes = serializer.pack(*args)[0]
    return packed


# Connections the reads of fcall_ro keep checked out of a client's pool between calls, by pool:
# the pool's checkout and release (a lock, a deprecation check of the arguments, observability
# records and events) cost as much as the call's send and read. Still the pool's (in use, to it):
# counted against its size, and closed with it when the client is closed. At most _KEPT idle a
# pool; one more goes back to the pool after its call.
_IDLE: weakref.WeakKeyDictionary[ConnectionPool, list[Connection]] = weakref.WeakKeyDictionary()
_KEPT = 8


async def fcall_ro(redis: Redis, function: str, keys: Sequence[str], *args: Any) -> Any:
    """``FCALL_RO function len(keys) *keys *args``: the reply, as ``execute_command`` gives it.

    For the API's hottest reads, on one Redis: the command is packed, sent and its reply read as
    ``execute_command`` does, on a connection kept for these calls (``_IDLE``) and checked as
    the pool checks one it hands out (data left unread, or closed by the server: connected
    afresh), without the client's wrapper around the call: its retry loop, for which
    ``open_redis``'s clients have no retries (a failure is raised, the connection dropped, as
    here), its observability records and its per-command checks: a read's call took 63 µs of
    CPU through ``execute_command`` (redis-py's send), 31 here (docs/architecture.md,
    "Performance"). A cluster's client, or one given retries, takes ``execute_command``.
    """
    command = ("FCALL_RO", function, len(keys), *keys, *args)
    if not isinstance(redis, Redis) or redis.connection is not None:
        return await redis.execute_command(*command)  # type: ignore[no-untyped-call]
    pool = redis.connection_pool
    idle = _IDLE.get(pool)
    if idle is None:
        idle = _IDLE[pool] = []
    connection = idle.pop() if idle else await pool.get_connection()  # type: ignore[no-untyped-call]
    if connection.retry.get_retries():
        await pool.release(connection)
        return await redis.execute_command(*command)  # type: ignore[no-untyped-call]
    try:
        if connection.is_connected:
            # The pool's checks: at checkout, data left unread or a connection the server
            # closed; at release, one marked for a reconnect.
            try:
                stale = connection.should_reconnect() or await connection.can_read()
            except (RedisConnectionError, OSError):
                stale = True
            if stale:
                await connection.disconnect()
        await connection.send_packed_command(connection.pack_command(*command))
        return await connection.read_response()
    except ResponseError:  # an error reply, read whole: the connection is clean
        raise
    except BaseException:
        # What redis-py's send and read do on a failure (a connection left disconnected
        # connects again at its next send).
        await connection.disconnect(nowait=True)
        raise
    finally:
        if len(idle) < _KEPT:
            idle.append(connection)
        else:
            await pool.release(connection)


def library_source() -> str:
    """The whole library as one source for one ``FUNCTION LOAD``: the names of
    :mod:`shared.functions` as the Lua table ``FUNCTIONS``, then the files of ``shared/lua/``.
    Raises ``ValueError`` if a file is left out of ``LUA_FILES``, or if the files register other
    functions than :mod:`shared.functions` names: better at start-up than at the first call."""
    folder = resources.files("shared").joinpath("lua")
    present = {path.name for path in folder.iterdir() if path.name.endswith(".lua")}
    if present != {f"{file}.lua" for file in LUA_FILES}:
        raise ValueError(f"shared/lua/ holds {sorted(present)}, LUA_FILES names {LUA_FILES}")
    names = []
    for key, name in REGISTERED.items():
        if not (_LUA_NAME.fullmatch(key) and _LUA_NAME.fullmatch(name)):
            raise ValueError(f"not a Lua identifier: {key!r} = {name!r}")
        names.append(f"  {key} = '{name}',\n")
    parts = [f"#!lua name={LIBRARY}\n\n", "local FUNCTIONS = {\n", *names, "}\n\n"]
    for file in LUA_FILES:
        text = folder.joinpath(f"{file}.lua").read_text("utf-8")
        parts += [f"-- shared/lua/{file}.lua\n", text, "\n"]
    source = "".join(parts)
    mismatch = set(_REGISTERS.findall(source)) ^ set(REGISTERED)
    if mismatch:
        raise ValueError(
            f"registered in shared/lua/ or named in shared/functions.py only: {mismatch}"
        )
    return source


@contextlib.asynccontextmanager
async def open_redis(
    url: str,
    *,
    load_functions: bool = False,
    cluster: bool = False,
    wait: bool = False,
    waiting: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[Redis]:
    """A client of ``url`` that decodes replies to ``str``, closed on exit: :func:`redis_client`
    once :func:`connect` has found it answering.

    With ``load_functions`` the Ladder function library is (re)loaded first: loading replaces the
    library atomically, so every process may do it at start-up. With ``cluster`` the client is
    a Redis Cluster's (shared/redis_cluster.py), ``url`` naming one of its nodes or several,
    comma-separated (any one that answers will do); it offers the
    commands of ``Redis`` that Ladder uses, and is typed as one. With ``wait`` (a service
    starting) a Redis that does not answer yet is tried again, backing off up to 5 s, rather
    than failed at once: a service that exits is soon given up on by its process manager; each
    failed try is handed to ``waiting``, for the service's ``/readyz`` to say why it is not
    ready yet.
    """
    async with redis_client(url, load_functions=load_functions, cluster=cluster) as client:
        await connect(client, load_functions=load_functions, wait=wait, waiting=waiting)
        yield client


@contextlib.asynccontextmanager
async def redis_client(
    url: str, *, load_functions: bool = False, cluster: bool = False
) -> AsyncIterator[Redis]:
    """The client :func:`open_redis` opens, before any connection is made (a process that
    serves while it waits for Redis to answer), closed on exit."""
    options: dict[str, Any] = {}
    if url.startswith("redis://"):
        options["connection_class"] = PackedConnection
    client: Redis
    if cluster:
        first, nodes = seed_nodes(url)
        node = cast(
            LadderCluster,
            LadderCluster.from_url(
                first,
                startup_nodes=nodes,
                decode_responses=True,
                health_check_interval=15,
                **options,
            ),
        )
        if "connection_class" in options:
            node.use_connection_class(options["connection_class"])
        if load_functions:
            node.library = library_source()
        client = cast(Redis, node)
    else:
        pool = BlockingConnectionPool.from_url(
            url,
            decode_responses=True,
            health_check_interval=15,
            max_connections=POOL_SIZE,
            timeout=POOL_WAIT,
            **options,
        )
        client = Redis.from_pool(pool)
    try:
        yield client
    finally:
        await client.aclose()


async def connect(
    client: Redis,
    *,
    load_functions: bool = False,
    wait: bool = False,
    waiting: Callable[[BaseException], None] | None = None,
) -> None:
    """Return once ``client``'s Redis answers (with ``load_functions``, once the library is
    loaded too), as :func:`open_redis` describes."""
    backoff = 0.5
    while True:
        try:
            await client.ping()
            break
        except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as exc:
            # (A cluster not formed yet, or none of its nodes reachable: the same wait.)
            if not wait:
                raise
            if waiting is not None:
                waiting(exc)
            log.warning("Redis unavailable; retrying", error=repr(exc), in_seconds=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        except ResponseError as exc:
            # The server has fewer databases (16 by default) than the URL's index asks.
            if "DB index is out of range" not in str(exc):
                raise
            raise SettingsError(
                "LADDER_REDIS_URL names a database the Redis server has not (its "
                "`databases` setting: 16 by default, indexes 0 to 15)"
            ) from None
    if load_functions:
        await client.function_load(library_source(), replace=True)


async def ensure_group(redis: Redis, stream: str, group: str, *, make_stream: bool = True) -> bool:
    """Consumer group ``group`` on ``stream``, from its first entry; one that exists already is
    left as it is. The stream is made if need be, or with ``make_stream=False`` left missing:
    ``False`` then, and no group. The rebuild calls it after Redis lost its data, and the relays
    after a ``NOGROUP``: the group went away (a flush, a restore, the board's keys unlinked with
    the board) and what was accepted since is still to go out."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=make_stream)
    except ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return True
        if not make_stream and "requires the key to exist" in str(exc):
            return False
        raise
    return True


async def forget_consumers(
    redis: Redis, streams: Sequence[str], group: str, idle_ms: int, consumer: str = ""
) -> int:
    """Delete the consumers of group ``group`` of each of ``streams`` (``consumer`` alone, if
    named) that have no entry pending and have been idle ``idle_ms`` at least, each in one step
    with the look at its pending entries (shared/lua/relay.lua), in one pipeline; how many were.
    A stream or group that is gone has none. The relays forget so the consumers of processes
    that stopped or died, which a group keeps until they are deleted (shared/relaying.py)."""
    async with redis.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.fcall(FORGET_CONSUMERS_FUNCTION, 1, stream, group, idle_ms, consumer)
        return sum(int(n) for n in await pipe.execute())
