"""``make rebuild`` as the upgrade to exact scores (docs/architecture.md, "Ranking and ties"):
boards written in the layout before it (one composite double of score and reach tick, bare user
ids for members, no hash of tie keys) come back in the layout of shared/ranking.py, and nothing
of the old layout survives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.rebuild.rebuilder import Rebuilder
from shared.boards import BoardCatalog
from shared.db_boards import save_board
from shared.keys import Keys
from shared.ranking import parse_record, tie_key
from shared.settings import LadderSettings
from tests.helpers import read_view
from tests.rebuild.test_rebuild import BOARDS, eu, projection, relay, write

# The old all-time composite: score * 2**30 + (2**30 - 1 - seconds since 2024-01-01).
_OLD_SCALE = 2**30


def old_composite(score: int, tick: int) -> float:
    return float(score * _OLD_SCALE + (_OLD_SCALE - 1 - tick))


async def test_a_rebuild_turns_old_layout_boards_into_the_new_one(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """The history is written through today's write path, recorded, and Redis then made to hold
    what the old layout held for it (composites, bare members, no tie hashes, an old global
    view). The rebuild gives back exactly the boards today's writes made, and drops the old
    global view, marking its users for the merge."""
    board = BOARDS[0]  # incr, teams, descending
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)
    base = datetime.now(UTC) - timedelta(seconds=20)
    at = [(base + timedelta(milliseconds=i)).isoformat() for i in range(4)]
    await write(redis, keys, settings, board, **eu("e1", "ana", 5, at[0], team_id="red"))
    await write(redis, keys, settings, board, **eu("e2", "bob", 5, at[1], team_id="red"))
    await write(redis, keys, settings, board, **eu("e3", "cy", 7, at[2]))
    await write(redis, keys, settings, board, **eu("e4", "cy", -2, at[3]))
    await relay(redis, keys, db, board)
    made = await projection(redis, settings)

    region = keys.region_view("main", "alltime", "all", "eu")
    teams = keys.teams_view("main", "alltime", "all")
    glob = keys.global_view("main", "alltime", "all")
    # The old layout, by hand: every view replaced by composites of bare ids, no tie hashes.
    for view in (region, teams, glob):
        await redis.delete(view, keys.ties(view), keys.distinct(view))
    await redis.zadd(region, {"ana": old_composite(5, 10), "bob": old_composite(5, 11)})
    await redis.zadd(region, {"cy": old_composite(5, 12)})
    await redis.zadd(keys.distinct(region), {"5": 5})
    await redis.zadd(teams, {"red": old_composite(10, 11)})
    await redis.zadd(glob, {"ana": old_composite(5, 10), "zed": old_composite(3, 9)})
    await redis.zadd(keys.distinct(glob), {"5": 5, "3": 3})

    done = await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()
    assert [(r.board_id, r.events) for r in done] == [("main", 4)]

    after = await projection(redis, settings)
    # The board's own keys are those today's writes made, byte for byte; the old global view
    # and its distinct set are gone (the merge makes the view again from the regions).
    assert {k: v for k, v in after.items() if not k.startswith(glob)} == {
        k: v for k, v in made.items() if not k.startswith(glob)
    }
    assert not await redis.exists(glob, keys.distinct(glob))
    assert await read_view(redis, region, True) == [("ana", 5), ("bob", 5), ("cy", 5)]
    assert await read_view(redis, teams, True) == [("red", 10)]
    # No member of any view is a bare id: each has its id's tie key in front, which its record
    # names.
    for view in (region, teams):
        records = await redis.hgetall(keys.ties(view))
        members = sorted(parse_record(r)[0] + i for i, r in records.items())
        assert members == sorted(await redis.zrange(view, 0, -1))
    dirty = await redis.smembers(keys.dirty("main"))
    assert {"alltime|all|eu|ana", "alltime|all|eu|zed"} <= dirty


async def test_a_global_view_of_bare_tie_keys_is_dropped_and_merged_again(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """A global view of the first exact-score layout (members with tie keys, but a hash of bare
    tie keys rather than records) is deleted with its hash once its users are marked dirty: the
    merge would not read its hash."""
    board = BOARDS[0]
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)
    at = datetime.now(UTC).replace(microsecond=0).isoformat()
    await write(redis, keys, settings, board, **eu("e1", "ana", 5, at, team_id="red"))
    await relay(redis, keys, db, board)
    glob = keys.global_view("main", "alltime", "all")
    tie = tie_key(1_700_000_000_000)
    await redis.zadd(glob, {tie + "ana": 5, tie + "zed": 3})
    await redis.hset(keys.ties(glob), mapping={"ana": tie, "zed": tie})
    await redis.zadd(keys.distinct(glob), {"5": 5, "3": 3})

    await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()

    assert not await redis.exists(glob, keys.ties(glob), keys.distinct(glob))
    dirty = await redis.smembers(keys.dirty("main"))
    assert {"alltime|all|eu|ana", "alltime|all|eu|zed"} <= dirty


async def test_a_rebuild_puts_the_users_regions_hash_in_place_of_sets_of_the_layout_before(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """Users' regions kept as the layout before kept them, a set a user (one of a user MySQL
    does not know among them): the rebuild makes the board's users' regions hash from the
    history, and no set of a user is left."""
    board = BOARDS[0]
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)
    at = datetime.now(UTC).replace(microsecond=0).isoformat()
    await write(redis, keys, settings, board, **eu("e1", "ana", 5, at, team_id="red"))
    await write(redis, keys, settings, board, **eu("e2", "bob", 3, at))
    await relay(redis, keys, db, board)
    await redis.delete(keys.user_regions("main"))
    for user, regions in (("ana", ["eu"]), ("bob", ["eu", "na"]), ("ghost", ["eu"])):
        await redis.sadd(keys.legacy_user_regions("main", user), *regions)

    await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()

    assert await redis.hgetall(keys.user_regions("main")) == {"ana": "eu", "bob": "eu"}
    for user in ("ana", "bob", "ghost"):
        assert not await redis.exists(keys.legacy_user_regions("main", user))
