"""Redis connections and the Ladder function library."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import resources

from redis.asyncio import Redis

LIBRARY = "ladder_v1"
SUBMIT_FUNCTION = "ladder_submit_v1"
TAKE_FUNCTION = "ladder_take_v1"
PUT_FUNCTION = "ladder_put_v1"
AWARD_FUNCTION = "ladder_award_v1"
CONTRIBUTE_FUNCTION = "ladder_contribute_v1"
HOT_ADD_FUNCTION = "ladder_hot_add_v1"
HOT_TRIM_FUNCTION = "ladder_hot_trim_v1"


def library_source() -> str:
    return resources.files("shared").joinpath("ladder.lua").read_text(encoding="utf-8")


@contextlib.asynccontextmanager
async def open_redis(url: str, *, load_functions: bool = False) -> AsyncIterator[Redis]:
    """A client of ``url`` that decodes replies to ``str``, closed on exit.

    With ``load_functions`` the Ladder function library is (re)loaded first: loading replaces the
    library atomically, so every process may do it at start-up.
    """
    client = Redis.from_url(url, decode_responses=True, health_check_interval=15)
    try:
        await client.ping()
        if load_functions:
            await client.function_load(library_source(), replace=True)
        yield client
    finally:
        await client.aclose()
