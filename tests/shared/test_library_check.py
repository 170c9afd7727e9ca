"""The readiness check of Redis's function library (shared/library.py ``check_library``): a library
lost with Redis's data, and one of another release loaded over this one's (a process of that
release started since, on the same Redis), are each told apart from this release's own."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from shared.functions import LIBRARY, SUBMIT_FUNCTION, WRITE_FUNCTION
from shared.library import LibraryLost, LibraryMismatch, check_library
from tests.conftest import ON_CLUSTER

pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="a cluster client loads the library itself")


class Listing:
    """A client whose ``FUNCTION LIST`` answers ``reply`` (the function library is one for the
    whole Redis server: the test changes no other client's)."""

    def __init__(self, reply: list[Any]) -> None:
        self.reply = reply

    async def function_list(self, library: str) -> list[Any]:
        assert library == LIBRARY
        return self.reply


def without(library: list[Any], names: set[str]) -> list[Any]:
    """A ``FUNCTION LIST`` entry of ``library`` without the functions ``names``."""
    fields = dict(zip(library[::2], library[1::2], strict=True))
    key = next(k for k in fields if k in ("functions", b"functions"))
    fields[key] = [f for f in fields[key] if text(f[1]) not in names]
    return [part for pair in fields.items() for part in pair]


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def test_this_releases_library_is_ready_and_another_or_none_is_not(redis: Redis) -> None:
    # The reply of the real server, with the library the fixture loaded.
    (library,) = await redis.function_list(library=LIBRARY)
    older = without(library, {SUBMIT_FUNCTION, WRITE_FUNCTION})

    await check_library(redis)
    await check_library(Listing([library]))  # type: ignore[arg-type]
    with pytest.raises(LibraryMismatch) as mismatch:
        await check_library(Listing([older]))  # type: ignore[arg-type]
    with pytest.raises(LibraryLost):
        await check_library(Listing([]))  # type: ignore[arg-type]

    said = str(mismatch.value)
    assert f"without {SUBMIT_FUNCTION}, {WRITE_FUNCTION}:" in said
    assert "every process that shares this Redis must run one release" in said
