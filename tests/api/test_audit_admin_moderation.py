"""A hide and a show of the same user asked at the same time (docs/api.md section 8b), against
the real Redis and MySQL: whichever is answered last is what every store holds, the history
database, the board's set of hidden users and the views alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.api import eraser
from shared import hidden
from shared.erasure import BoardDeletion
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, done, erase_u_a, get_ok, post, score
from tests.helpers import ADMIN, api_client, eventually

# Every test on its own migrated database, which the API's quiet settings name.
pytestmark = [
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
    pytest.mark.usefixtures("mysql_database"),
]

HIDDEN = "/v1/boards/main/users/u-a/hidden"


@pytest.mark.parametrize("first", ["hide", "show"])
async def test_a_hide_and_a_show_at_once_leave_every_store_as_the_last_answered(
    first: str,
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first call's move through the views takes a while (a large keyspace to walk); the
    other call is asked meanwhile. Before, the second ran through whole in between, and the
    first's move then undid its effect on the views alone: a user shown in MySQL and in the
    set of hidden users yet missing from every view (or hidden there yet listed)."""
    original = hidden.move
    moving = asyncio.Event()

    async def slow_move(*args: Any, show: bool) -> int:
        if not moving.is_set():
            moving.set()
            await asyncio.sleep(0.5)
        return await original(*args, show=show)

    async with api_client(quiet) as client:
        await post(client, score(user_id="u-a", value=50))
        await post(client, score(user_id="u-b", value=30))
        if first == "show":
            assert (await client.put(HIDDEN, headers=ADMIN)).status_code == 204
        monkeypatch.setattr(hidden, "move", slow_move)
        one = asyncio.create_task(
            client.request("PUT" if first == "hide" else "DELETE", HIDDEN, headers=ADMIN)
        )
        await asyncio.wait_for(moving.wait(), 5)
        other = await client.request("DELETE" if first == "hide" else "PUT", HIDDEN, headers=ADMIN)
        assert (await one).status_code == 204 and other.status_code == 204
        monkeypatch.setattr(hidden, "move", original)
        page = await get_ok(client, LEADERBOARD, scope="region:eu", period="alltime")

    listed = [e["user_id"] for e in page["entries"]]
    async with db.connect() as conn:
        in_mysql = await hidden.stored(conn, "main")
    in_set = await redis.smembers(keys.hidden("main"))
    # The other call was answered last: its state is the one kept everywhere.
    if first == "hide":
        assert (in_mysql, in_set, listed) == ([], set(), ["u-a", "u-b"])
    else:
        assert (in_mysql, in_set, listed) == (["u-a"], {"u-a"}, ["u-b"])


async def test_many_hides_at_once_are_each_answered_at_once(
    quiet: LadderSettings, redis: Redis
) -> None:
    """Hides of 30 users at once, more than the API's pool of MySQL connections (15): each holds
    its user's lock on one connection and stores its row on that same one, so none waits for a
    connection that another holds while it waits (they were 503s after the pool's 30 s)."""
    async with api_client(quiet) as client:
        answers = await asyncio.gather(
            *(client.put(f"/v1/boards/main/users/u-{n}/hidden", headers=ADMIN) for n in range(30))
        )
    assert [a.status_code for a in answers] == [204] * 30
    assert len(await redis.smembers(Keys(quiet.key_prefix).hidden("main"))) == 30


async def test_an_api_starting_while_a_board_deletion_finishes_hides_nobody_on_the_fresh_board(
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deletion's last pass unlinks the board's keys, then its finish sets the board's events
    apart (a while, on a board of many events) and drops its hidden users from MySQL. An API
    process that starts in between hides again whom MySQL still holds hidden: before, on the
    deleted board too, whose set of hidden users was then back for good, and a user hidden on
    the old board stayed out of every view of a fresh board of the name."""
    original = eraser.finish_board_deletion

    async def restart_then_finish(engine: AsyncEngine, deletion: BoardDeletion) -> None:
        await hidden.restore(engine, redis, keys)  # what an API process's start does
        await original(engine, deletion)

    monkeypatch.setattr(eraser, "finish_board_deletion", restart_then_finish)
    board = "/v1/boards/arena"
    async with api_client(quiet) as client:
        assert (await client.put(board, json={}, headers=ADMIN)).status_code == 201
        await post(client, score(user_id="u-2", value=7), board="arena")
        assert (await client.put(f"{board}/users/u-2/hidden", headers=ADMIN)).status_code == 204
        assert (await client.delete(board, headers=ADMIN)).status_code == 202
        await eventually(lambda: done(client, "/v1/board-deletions/arena"), within=30)

        assert (await client.put(board, json={}, headers=ADMIN)).status_code == 201
        for user, value in (("u-2", 5), ("u-3", 3)):
            await post(client, score(user_id=user, value=value), board="arena")
        page = await get_ok(client, f"{board}/leaderboard", scope="region:eu", period="alltime")

    assert [e["user_id"] for e in page["entries"]] == ["u-2", "u-3"]
    assert await redis.smembers(keys.hidden("arena")) == set()
    async with db.connect() as conn:
        assert await hidden.stored(conn, "arena") == []


async def test_a_hide_asked_while_the_user_is_being_erased_leaves_nothing_after_the_erasure(
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    db: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hide of a user whose erasure is pending is the erased user's, as a score write then
    is: once the erasure is done, the user is hidden nowhere. Before, a hide that came while the
    erasure's last pass ran after it had dropped the user's hides was answered 204 and kept for
    good, in MySQL and in the board's set: the erased user's id named in the history database,
    and a fresh user of that id hidden from its first write."""
    answers: list[int] = []

    async def hide_meanwhile() -> None:
        # The erasure's last step, after its hides and friends are gone: a hide comes now.
        answers.append((await client.put(HIDDEN, headers=ADMIN)).status_code)

    async with api_client(quiet) as client:
        await erase_u_a(client, monkeypatch, hide_meanwhile)

        async with db.connect() as conn:
            assert await hidden.stored(conn, "main") == []
        assert await redis.smembers(keys.hidden("main")) == set()
        # Refused as a write then is, with the wait.
        assert answers and set(answers) == {503}, answers
        # Done: the id is a fresh user's, whom a hide hides.
        assert (await client.put(HIDDEN, headers=ADMIN)).status_code == 204
