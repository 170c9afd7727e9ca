"""The erasure worker finds the keys of the users it erases with one ``SCAN`` of every board's
keys a round, whatever the number of users (services/api/eraser.py): a walk of the keyspace
costs the keyspace's size, and a queue of erasures must not pay it once for each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

import shared.erasure as erasure
from services.api.eraser import Eraser
from shared.boards import BoardCatalog
from shared.db import open_engine
from shared.erasure import request_erasure
from shared.keys import Keys
from shared.ranking import id_of
from shared.settings import LadderSettings
from tests.api.helpers import post, score
from tests.helpers import api_client

ERASED = ("u-1", "u-2", "u-3")
KEPT = "u-keep"


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def records_by_user(redis: Redis, keys: Keys) -> dict[str, int]:
    """How many event records name each user, on every board (a walk of its own, not counted
    among the worker's)."""
    found: dict[str, int] = {}
    async for key in type(redis).scan_iter(redis, match=keys.boards_match(), count=1000):
        if (user := keys.record_user(key)) is not None:
            found[user] = found.get(user, 0) + 1
    return found


async def test_a_round_of_several_erasures_scans_the_keyspace_once_and_erases_each(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(erasure, "USER_SETTLE_SECONDS", 0.2)
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        for user in (*ERASED, KEPT):
            for n in range(2):
                await post(client, score(user_id=user, event_id=f"e-{user}-{n}", value=n + 1))
        assert await records_by_user(redis, keys) == dict.fromkeys((*ERASED, KEPT), 2)
        for user in ERASED:
            await request_erasure(engine, redis, keys, user, quiet.effective_jwt_secret)

        scans: list[str] = []
        scan_iter = redis.scan_iter

        def counted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            scans.append(kwargs.get("match", ""))
            return scan_iter(*args, **kwargs)

        monkeypatch.setattr(redis, "scan_iter", counted)
        eraser = Eraser(engine, redis, keys, BoardCatalog(redis, keys), 0)
        assert await eraser.round() == 0  # the three first passes
        assert scans == [keys.boards_match()]
        assert await records_by_user(redis, keys) == {KEPT: 2}

        await asyncio.sleep(0.8)  # past the cut-offs and the margin
        assert await eraser.round() == 3  # the three second passes: done
        assert scans == [keys.boards_match()] * 2
        assert await eraser.round() == 0
        assert len(scans) == 2  # nothing pending: no scan
    assert await records_by_user(redis, keys) == {KEPT: 2}
    view = keys.region_view("main", "alltime", "all", "eu")
    assert [id_of(m) for m in await redis.zrange(view, 0, -1)] == [KEPT]
