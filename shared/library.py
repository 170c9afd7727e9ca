"""Whether Redis holds this release's function library (shared/lua/, loaded by
:func:`shared.redis.library_source`): the readiness check of every service that calls it."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from shared.functions import LIBRARY, REGISTERED


class LibraryLost(RuntimeError):
    """Redis answers, but without the function library: restarted without its data."""

    def __init__(self) -> None:
        super().__init__("the function library is not loaded; make rebuild loads it again")


class LibraryMismatch(RuntimeError):
    """Redis holds another release's function library: a process of that release loaded it
    since this one did (every process loads its own at its start), and this one's calls of the
    functions it lacks fail."""

    def __init__(self, missing: set[str]) -> None:
        names = ", ".join(sorted(missing)[:3]) + (", ..." if len(missing) > 3 else "")
        super().__init__(
            f"the function library is another release's, without {names}: every process "
            "that shares this Redis must run one release"
        )


def _function_names(library: Any) -> set[str]:
    """The names of the functions in one library of ``FUNCTION LIST``'s reply."""
    return {_text(_fields(f)["name"]) for f in _fields(library)["functions"]}


def _fields(reply: Any) -> dict[str, Any]:
    """A reply's fields: RESP2's flat pairs (as bytes, or text with ``decode_responses``) or
    RESP3's map."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {_text(key): value for key, value in pairs}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def check_library(client: Redis, cluster: bool = False) -> None:
    """Raise :class:`LibraryLost` (``/readyz`` gives it as the reason) if ``client``'s Redis
    has not the function library, :class:`LibraryMismatch` if its library lacks a function this
    release calls. A cluster client loads it again itself on the first call that misses it on a
    node (shared/redis_cluster.py): there, nothing is checked."""
    if cluster:
        return
    listed = await client.function_list(library=LIBRARY)
    if not listed:
        raise LibraryLost
    missing = set(REGISTERED.values()) - _function_names(listed[0])
    if missing:
        raise LibraryMismatch(missing)
