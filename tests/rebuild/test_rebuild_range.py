"""A global sum past the range (docs/api.md section 1) before and after a rebuild: the entry is
held at the range's end whenever the merge runs, so a global view merged again from rebuilt
regional views equals the live one, merged between the writes."""

from __future__ import annotations

from datetime import UTC, datetime

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.aggregator.merge import Merger
from services.rebuild.rebuilder import Rebuilder
from shared.boards import Board, BoardCatalog
from shared.db_boards import save_board
from shared.keys import Keys, dirty_member
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from tests.helpers import read_view
from tests.rebuild.test_rebuild import relay, write

BOARD = Board(board_id="sum", periods=("alltime",), min_value=-MAX_SCORE, max_value=MAX_SCORE)


async def test_a_user_past_the_range_is_ranked_alike_live_and_after_a_rebuild(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    await save_board(db, BOARD)
    await BoardCatalog(redis, keys).put(BOARD)
    at = datetime.now(UTC).isoformat()
    glob = keys.global_view("sum", "alltime", "all")
    merger = Merger(redis, keys)
    # Live: d's first region merged alone, then its second, whose sum is past the range.
    for writes in ((("e1", "d", "eu", MAX_SCORE), ("e2", "e", "eu", 3)), (("e3", "d", "na", 1),)):
        for event_id, user, region, value in writes:
            body = {"user_id": user, "region": region, "value": value, "occurred_at": at}
            await write(redis, keys, settings, BOARD, event_id=event_id, **body)
            await redis.sadd(keys.dirty("sum"), dirty_member("alltime", "all", region, user))
        await relay(redis, keys, db, BOARD)
        await merger.merge_board(BOARD)
    live = await read_view(redis, glob, True)
    assert live == [("d", MAX_SCORE), ("e", 3)]
    records = await redis.hgetall(Keys.ties(glob))

    # Every key lost, then rebuilt from history: both of d's regions merged in one call.
    for match in ("{" + settings.key_prefix + ":*", settings.key_prefix + ":*"):
        async for key in redis.scan_iter(match=match):
            await redis.delete(key)
    await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()
    await merger.merge_board(BOARD)
    assert await read_view(redis, glob, True) == live
    assert await redis.hgetall(Keys.ties(glob)) == records
