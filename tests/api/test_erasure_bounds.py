"""What the erasure worker leaves behind is bounded (docs/api.md section 8b): no MVP mark on a
board that keeps no MVPs, where nothing would ever take it; no mark in a process of a job that
another process finished."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

import shared.erasure as erasure
from services.api.eraser import Eraser
from shared.boards import Board, BoardCatalog
from shared.db import open_engine
from shared.erasure import record_board_deletion, request_erasure
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import post, score
from tests.helpers import ADMIN, api_client


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def test_an_erasure_marks_mvps_only_on_boards_that_keep_them(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    """The pass marks each kept period of an incr board for its MVP view (the user's share goes);
    a best board has no MVP view, and a mark there would stay for good, one more period each
    erasure (the aggregator never computes, so never takes, a best board's MVPs)."""
    async with api_client(quiet) as client, open_engine(quiet.mysql_url) as engine:
        best = {"operator": "best"}
        assert (await client.put("/v1/boards/best", json=best, headers=ADMIN)).status_code == 201
        for board_id in ("main", "best"):
            await post(client, score(user_id="u-1", value=5), board=board_id)
        catalog = BoardCatalog(redis, keys)
        await Eraser(engine, redis, keys, catalog, 0).erase_user("u-1", datetime.now(UTC))
    assert "alltime|all" in await redis.smembers(keys.mvp_dirty("main"))
    assert not await redis.exists(keys.mvp_dirty("best"))


async def test_a_job_another_process_finished_leaves_no_mark_behind(
    quiet: LadderSettings, redis: Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every API process runs the worker, one at a time under a lock, so a job's first pass and
    its second (after the cut-off) are often made by two processes. The one that made the first
    pass keeps a mark of it meanwhile; once the job is done elsewhere the mark goes, or it would
    stay for the life of the process, one for each user erased and each board deleted."""
    monkeypatch.setattr(erasure, "USER_SETTLE_SECONDS", 0.2)
    monkeypatch.setattr(erasure, "BOARD_SETTLE_SECONDS", 0.2)
    catalog = BoardCatalog(redis, keys)
    async with open_engine(quiet.mysql_url) as engine:
        first = Eraser(engine, redis, keys, catalog, 0)
        second = Eraser(engine, redis, keys, catalog, 0)
        for user in ("u-1", "u-2"):
            await request_erasure(engine, redis, keys, user, quiet.effective_jwt_secret)
        await catalog.put(Board(board_id="cup"))
        async with engine.begin() as conn:
            await record_board_deletion(conn, "cup", False)
        assert await first.round() == 0  # the first passes
        await asyncio.sleep(0.8)  # past the cut-offs and the margin
        assert await second.round() == 3  # the second passes: done
        assert await first.round() == 0
    assert first._first_pass_done == set()
    assert second._first_pass_done == set()
