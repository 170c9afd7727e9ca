"""``make rebuild`` keeps hidden users hidden (docs/api.md section 8b): the hidden set is made
again from MySQL's ``hidden_users`` before the events are replayed, on the real Redis and
MySQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.aggregator.merge import Merger
from services.rebuild.keyspace import _REBUILT
from services.rebuild.rebuilder import Rebuilder
from shared import hidden
from shared.boards import Board, BoardCatalog
from shared.db_boards import save_board
from shared.keys import Keys, dirty_member
from shared.ranking import id_of
from shared.settings import LadderSettings
from tests.api.helpers import assert_problem
from tests.helpers import ADMIN, UNREACHABLE_BROKER, api_client, player
from tests.rebuild.test_rebuild import eu, projection, relay, write

HIDDEN = "/v1/boards/main/users/{}/hidden"

BOARD = Board(board_id="main")


async def ranked(redis: Redis, key: str) -> list[str]:
    return [id_of(m) for m in await redis.zrevrange(key, 0, -1)]


async def test_a_rebuild_keeps_hidden_users_hidden_and_the_rest_as_it_was(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """u2 hidden (MySQL, then Redis, then its members moved, as the API does): a rebuild after
    Redis lost every key the rebuild makes, makes each key again as it was, u2's records without its
    members, and the global view that the merge makes from them leaves it out. A user shown
    again before the rebuild (u3) is shown after it."""
    await save_board(db, BOARD)
    await BoardCatalog(redis, keys).put(BOARD)
    now = datetime.now(UTC).isoformat()
    for n, (user, value) in enumerate((("u1", 5), ("u2", 9), ("u3", 7))):
        await write(redis, keys, settings, BOARD, **eu(f"e{n}", user, value, now))
    for user in ("u2", "u3"):
        await hidden.store(db, "main", user, hidden=True)
        await redis.sadd(keys.hidden("main"), user)
        await hidden.move(redis, keys, "main", user, show=False)
    await hidden.store(db, "main", "u3", hidden=False)
    await redis.srem(keys.hidden("main"), "u3")
    await hidden.move(redis, keys, "main", "u3", show=True)
    # A write of a hidden user keeps it out.
    await write(redis, keys, settings, BOARD, **eu("e3", "u2", 1, now))
    await relay(redis, keys, db, BOARD)
    region = keys.region_view("main", "alltime", "all", "eu")
    assert await ranked(redis, region) == ["u3", "u1"]
    before = await projection(redis, settings)

    # Redis loses every key the rebuild makes, the hidden set among them.
    tag = keys.tag("main")
    async for key in redis.scan_iter(match=tag + ":*"):
        if _REBUILT.fullmatch(key[len(tag) + 1 :]):
            await redis.delete(key)
    assert await redis.exists(keys.hidden("main"), region) == 0
    await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()

    after = await projection(redis, settings)
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert differ == []
    assert await redis.smembers(keys.hidden("main")) == {"u2"}
    assert await ranked(redis, region) == ["u3", "u1"]
    assert await redis.hexists(keys.ties(region), "u2")
    await Merger(redis, keys).merge_board(BOARD)
    assert await ranked(redis, keys.global_view("main", "alltime", "all")) == ["u3", "u1"]


async def test_a_hide_or_show_refused_for_a_rebuild_changes_nothing(
    redis: Redis, keys: Keys, quiet: LadderSettings, db: AsyncEngine, monkeypatch: Any
) -> None:
    """A hide or a show while the board is being rebuilt is a 503 that changes nothing, in
    MySQL either: the rebuild installs the hidden set it read from MySQL, so a row stored for a
    refused request would take effect at the next rebuild with no request answered for it. So
    also where the rebuild begins between the check and the row's store."""
    await hidden.store(db, "main", "u-shown-hidden", hidden=True)
    async with api_client(quiet) as client:
        await redis.set(keys.rebuilding("main"), "1")
        for method, user in (("PUT", "u-new"), ("DELETE", "u-shown-hidden")):
            response = await client.request(method, HIDDEN.format(user), headers=ADMIN)
            assert_problem(response, 503)
        await redis.delete(keys.rebuilding("main"))

        store = hidden.store

        async def rebuild_begins_meanwhile(*args: Any, **kwargs: Any) -> bool:
            changed = await store(*args, **kwargs)
            await redis.set(keys.rebuilding("main"), "1")
            return changed

        monkeypatch.setattr(hidden, "store", rebuild_begins_meanwhile)
        response = await client.put(HIDDEN.format("u-new"), headers=ADMIN)
        assert_problem(response, 503)
    async with db.connect() as conn:
        assert await hidden.stored(conn, "main") == ["u-shown-hidden"]
    # Only what the API's start put back from MySQL (shared/hidden.py restore): no refused
    # request's user.
    assert await redis.smembers(keys.hidden("main")) == {"u-shown-hidden"}


async def own_global_standing(settings: LadderSettings) -> tuple[int, Any]:
    """u2's global standing, read with its own player token (answered as if shown), but its
    ``as_of``: the rebuild's merge is another merge."""
    quiet = settings.model_copy(update={"amqp_url": UNREACHABLE_BROKER})
    async with api_client(quiet) as client:
        response = await client.get(
            "/v1/boards/main/users/u2", params={"scope": "global"}, headers=player("u2")
        )
    body = response.json()
    if response.status_code == 200:
        assert body.pop("as_of") is not None
    return response.status_code, body


async def test_a_rebuild_from_nothing_keeps_the_hidden_users_global_record(
    redis: Redis, keys: Keys, settings: LadderSettings, db: AsyncEngine
) -> None:
    """The rebuild marks every user of the rebuilt views for the merge, hidden users too (a
    record with no member): after Redis lost every key of the board, the merge makes u2's
    global record again, and u2's own read of its global standing answers as before."""
    board = Board(board_id="main", periods=("alltime",))
    await save_board(db, board)
    await BoardCatalog(redis, keys).put(board)
    now = datetime.now(UTC).isoformat()
    for n, (user, value) in enumerate((("u1", 5), ("u2", 9), ("u3", 7))):
        await write(redis, keys, settings, board, **eu(f"e{n}", user, value, now))
    await hidden.store(db, "main", "u2", hidden=True)
    await redis.sadd(keys.hidden("main"), "u2")
    await hidden.move(redis, keys, "main", "u2", show=False)
    await relay(redis, keys, db, board)
    marks = [dirty_member("alltime", "all", "eu", u) for u in ("u1", "u2", "u3")]
    await redis.sadd(keys.dirty("main"), *marks)
    await Merger(redis, keys).merge_board(board)
    glob = keys.global_view("main", "alltime", "all")
    before = (await redis.zrange(glob, 0, -1), await redis.hgetall(keys.ties(glob)))
    assert "u2" in before[1] and await ranked(redis, glob) == ["u3", "u1"]
    own = await own_global_standing(settings)
    assert own[0] == 200 and own[1]["score"] == 9, own

    # Redis loses every key of the board; then the rebuild, then the merge.
    async for key in redis.scan_iter(match=keys.tag("main") + ":*"):
        await redis.delete(key)
    await Rebuilder(db, redis, keys, settings, wait_seconds=5).run()
    await Merger(redis, keys).merge_board(board)
    assert (await redis.zrange(glob, 0, -1), await redis.hgetall(keys.ties(glob))) == before
    assert await own_global_standing(settings) == own
