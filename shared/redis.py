"""Redis connections and the Ladder function library."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from redis.asyncio import Connection, Redis
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

LIBRARY = "ladder_v1"
SUBMIT_FUNCTION = "ladder_submit_v1"
TAKE_FUNCTION = "ladder_take_v1"
PUT_FUNCTION = "ladder_put_v1"
AWARD_FUNCTION = "ladder_award_v1"
CONTRIBUTE_FUNCTION = "ladder_contribute_v1"
HOT_ADD_FUNCTION = "ladder_hot_add_v1"
HOT_TRIM_FUNCTION = "ladder_hot_trim_v1"
STANDING_FUNCTION = "ladder_standing_v1"


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
        packed: list[bytes] = self._serializer.pack(*args)
        return packed

    def pack_commands(self, commands: Any) -> list[bytes]:
        if self._serializer is None:
            return super().pack_commands(commands)
        return [b"".join(self._serializer.pack(*command)[0] for command in commands)]


def library_source() -> str:
    return resources.files("shared").joinpath("ladder.lua").read_text(encoding="utf-8")


@contextlib.asynccontextmanager
async def open_redis(url: str, *, load_functions: bool = False) -> AsyncIterator[Redis]:
    """A client of ``url`` that decodes replies to ``str``, closed on exit.

    With ``load_functions`` the Ladder function library is (re)loaded first: loading replaces the
    library atomically, so every process may do it at start-up.
    """
    options: dict[str, Any] = {}
    if url.startswith("redis://"):
        options["connection_class"] = PackedConnection
    client = Redis.from_url(url, decode_responses=True, health_check_interval=15, **options)
    try:
        await client.ping()
        if load_functions:
            await client.function_load(library_source(), replace=True)
        yield client
    finally:
        await client.aclose()
