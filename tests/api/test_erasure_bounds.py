"""What an erasure leaves behind is bounded (docs/api.md section 8b): no MVP mark on a board
that keeps no MVPs, where nothing would ever take it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from services.api.eraser import Eraser
from shared.boards import BoardCatalog
from shared.db import open_engine
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
