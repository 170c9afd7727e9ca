"""An erasure leaves the distinct-score sets exact (docs/api.md sections 5 and 8b): the erased
user's pair goes from the finished set and from the one being built, and the pair of the score
it held before a last write the aggregator left out goes too, so that the other users' dense
ranks close up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from services.aggregator.fresh import FreshRegions
from services.aggregator.main import batch_handler
from services.aggregator.merge import Merger
from services.api.eraser import Eraser
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board, BoardCatalog
from shared.db import open_engine
from shared.erasure import request_erasure
from shared.events import ScoreAccepted
from shared.keys import Keys, dirty_member
from shared.settings import LadderSettings
from tests.helpers import SERVER, api_client, derive_outbox


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    return quiet


async def board_of(
    redis: Redis, keys: Keys, settings: LadderSettings, board_id: str
) -> tuple[Board, BoardCatalog]:
    """A best-score board where a (10), b (5) and c (1) wrote in region eu, derived."""
    board = Board(board_id=board_id, operator="best", periods=("alltime",))
    catalog = BoardCatalog(redis, keys)
    await catalog.put(board)
    for i, (user, value) in enumerate((("a", 10), ("b", 5), ("c", 1))):
        await write(redis, keys, settings, board, user, value, f"e{i}")
    await derive_outbox(redis, keys, board, settings.feed_length)
    return board, catalog


async def write(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    board: Board,
    user: str,
    value: int,
    eid: str,
) -> None:
    at = datetime.now(UTC) - timedelta(seconds=5)
    body = ScoreIn(user_id=user, region="eu", value=value, occurred_at=at)
    await submit(redis, keys, settings, board, body, eid)


async def dense_reads(settings: LadderSettings, board_id: str, scope: str) -> tuple[Any, Any]:
    """The dense page and c's dense standing, as a client reads them."""
    params = {"scope": scope, "rank_style": "dense"}
    async with api_client(settings) as client:
        page = await client.get(f"/v1/boards/{board_id}/leaderboard", params=params, headers=SERVER)
        mine = await client.get(f"/v1/boards/{board_id}/users/c", params=params, headers=SERVER)
    assert page.status_code == 200, page.text
    assert mine.status_code == 200, mine.text
    return [(e["user_id"], e["score"], e["rank"]) for e in page.json()["entries"]], mine.json()


@pytest.mark.parametrize("scope", ["region:eu", "global"])
async def test_an_erased_users_pair_leaves_the_set_being_built(
    quiet: LadderSettings, redis: Redis, keys: Keys, scope: str
) -> None:
    """A dense build partway (10 and 5 taken) when b is erased: the walk does not come back to
    5, so the erasure takes it out of the set being built."""
    board, catalog = await board_of(redis, keys, quiet, "eb")
    marks = [dirty_member("alltime", "all", "eu", u) for u in ("a", "b", "c")]
    await redis.sadd(keys.dirty("eb"), *marks)
    merger = Merger(redis, keys)
    await merger.merge_board(board)
    view = keys.board_view("eb", "alltime", "all", scope)
    # A dense read asked for the view's set, and a first step of the build ran.
    await redis.sadd(keys.dense("eb"), "global" if scope == "global" else "region")
    await redis.sadd(keys.dense_build("eb"), f"alltime|all|{scope}")
    merger.build_step = 2
    assert await merger.build_dense(board, budget=0) == 0
    assert sorted(await redis.zrange(keys.distinct_building(view), 0, -1)) == ["10", "5"]
    async with open_engine(quiet.mysql_url) as engine:
        await Eraser(engine, redis, keys, catalog, 0).erase_user("b", datetime.now(UTC))
    assert await redis.zrange(keys.distinct_building(view), 0, -1) == ["10"]
    await merger.merge_board(board)
    assert await merger.build_dense(board) == 1
    assert await redis.zrange(keys.distinct(view), 0, -1) == ["1", "10"]
    page, mine = await dense_reads(quiet, "eb", scope)
    assert page == [("a", 10, 1), ("c", 1, 2)]
    assert (mine["rank"], mine["total"]) == (2, 2)


@pytest.mark.parametrize("erased_first", [False, True])
async def test_an_erased_users_last_write_left_out_leaves_no_pair(
    quiet: LadderSettings, redis: Redis, keys: Keys, erased_first: bool
) -> None:
    """The regional set built ({1, 5, 10}); b writes 7 just before its erasure is asked, and the
    aggregator leaves that event out (b is erased): the pair the write left (5) is synced all the
    same, whether the aggregator gets the event before the erasure's pass or after it."""
    board, catalog = await board_of(redis, keys, quiet, "ec")
    await redis.delete(keys.outbox("ec"))
    view = keys.region_view("ec", "alltime", "all", "eu")
    await redis.sadd(keys.dense("ec"), "region")
    await redis.sadd(keys.dense_build("ec"), "alltime|all|region:eu")
    await Merger(redis, keys).build_dense(board)
    assert await redis.zrange(keys.distinct(view), 0, -1) == ["1", "5", "10"]
    await write(redis, keys, quiet, board, "b", 7, "e3")
    entries: list[Any] = await redis.xrange(keys.outbox("ec"))
    events = [ScoreAccepted.model_validate_json(fields["e"]) for _, fields in entries]
    assert [e.user_id for e in events] == ["b"]
    handler = batch_handler(redis, keys, catalog, quiet, FreshRegions())
    async with open_engine(quiet.mysql_url) as engine:
        erasure = await request_erasure(engine, redis, keys, "b", quiet.effective_jwt_secret)
        eraser = Eraser(engine, redis, keys, catalog, 0)
        if erased_first:
            await eraser.erase_user("b", erasure.cutoff)
        await handler(events)  # b's event, left out
        await eraser.erase_user("b", erasure.cutoff)
    assert await redis.zrange(keys.distinct(view), 0, -1) == ["1", "10"]
    assert await redis.hget(keys.ties(view), "b") is None
    page, mine = await dense_reads(quiet, "ec", "region:eu")
    assert page == [("a", 10, 1), ("c", 1, 2)]
    assert (mine["rank"], mine["total"]) == (2, 2)
