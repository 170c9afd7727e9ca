"""Rank notifications of a fall (docs/api.md section 9): when a write makes its user fall out of
a top T, the user it moved up into that top gets ``entered_top``. The write names that user in
its outbox result (``pulled_in``, shared/lua/brackets.lua), and the notifier tells it."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from services.notifier.handlers import Notify
from services.notifier.rules import crossings
from shared.boards import Board, BoardCatalog
from shared.brackets import Crossing
from shared.events import PeriodResult, ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.notifier.test_badges import add_board, listening

SET = Board(board_id="lowered", operator="set", periods=["alltime"], notify_top=[1, 10])
INCR = Board(
    board_id="losses",
    operator="incr",
    periods=["alltime"],
    min_value=-1_000,
    notify_top=[1, 2, 3],
)
# A minute before each test starts (set by start_a_minute_ago): a time taken once at import
# would pass the allowed lateness in a suite that reaches these tests ten minutes later.
START = datetime.now(UTC)


@pytest.fixture(autouse=True)
def start_a_minute_ago() -> None:
    global START
    START = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=60)


def second(n: int) -> str:
    return (START + timedelta(seconds=n)).isoformat().replace("+00:00", "Z")


async def write(
    redis: Redis, keys: Keys, settings: LadderSettings, board: Board, *writes: tuple[str, int]
) -> list[ScoreAccepted]:
    """The writes, one a second in the order given, and the outbox entry each left."""
    out = []
    for i, (user, value) in enumerate(writes):
        body = ScoreIn(user_id=user, region="eu", value=value, occurred_at=second(i))
        await submit(redis, keys, settings, board, body, f"e{i}")
        entries: list[Any] = await redis.xrevrange(keys.outbox(board.board_id), count=1)
        out.append(ScoreAccepted.model_validate_json(entries[0][1]["e"]))
    return out


async def told(
    redis: Redis, keys: Keys, board: Board, event: ScoreAccepted, *users: str
) -> dict[str, list[tuple[Any, ...]]]:
    """The rank messages each of ``users`` hears when the notifier handles ``event``: (reason,
    top, rank, previous_rank, score)."""
    catalog = BoardCatalog(redis, keys)
    await add_board(redis, keys, board)
    async with contextlib.AsyncExitStack() as stack:
        channels = {
            user: await stack.enter_async_context(listening(redis, keys.user_channel(user)))
            for user in users
        }
        await Notify(redis, keys, catalog)([event])
        return {
            user: [
                (m["reason"], m["top"], m["rank"], m["previous_rank"], m["score"])
                for m in await channel.drain()
                if m["type"] == "rank" and m["scope"] == "region:eu"
            ]
            for user, channel in channels.items()
        }


def test_each_user_a_fall_moved_into_a_top_is_told_it_entered_the_smallest() -> None:
    result = PeriodResult(
        period_id="all",
        score=5,
        rank=12,
        previous_rank=1,
        improved=True,
        pulled_in={"1": "u-b", "10": "u-k", "100": "u-z"},
    )
    assert crossings("u-a", result, (1, 10)) == [
        Crossing("u-b", "entered_top", 1, 1, 2),
        Crossing("u-k", "entered_top", 10, 10, 11),
    ]
    # An entry written before the field parses, naming nobody.
    old = orjson.loads(result.model_dump_json())
    del old["pulled_in"]
    assert PeriodResult.model_validate(old).pulled_in == {}


async def test_a_lowered_set_score_tells_the_user_below_it_entered_the_top(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    events = await write(redis, keys, settings, SET, ("u-a", 100), ("u-b", 50), ("u-a", 10))

    result = events[-1].periods["alltime"]
    assert (result.rank, result.previous_rank, result.pulled_in) == (2, 1, {"1": "u-b"})
    assert await told(redis, keys, SET, events[-1], "u-a", "u-b") == {
        "u-a": [],
        "u-b": [("entered_top", 1, 1, 2, 50)],
    }


async def test_a_negative_increment_tells_each_user_it_moved_into_a_bracket(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    users = [("u-a", 100), ("u-b", 50), ("u-c", 40), ("u-d", 30), ("u-e", 20)]
    events = await write(redis, keys, settings, INCR, *users, ("u-a", -75))

    result = events[-1].periods["alltime"]
    # From 1st to 4th (25, above u-e's 20): the tops 1, 2 and 3 each took the one below in.
    assert (result.rank, result.previous_rank) == (4, 1)
    assert result.pulled_in == {"1": "u-b", "2": "u-c", "3": "u-d"}
    assert await told(redis, keys, INCR, events[-1], "u-b", "u-c", "u-d", "u-e") == {
        "u-b": [("entered_top", 1, 1, 2, 50)],
        "u-c": [("entered_top", 2, 2, 3, 40)],
        "u-d": [("entered_top", 3, 3, 4, 30)],
        "u-e": [],
    }


async def test_an_increment_of_zero_reaching_a_tie_later_tells_the_one_now_ahead(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    # u-a reached 50 first, so leads u-b's equal 50; its later increment of 0 makes its total
    # reached after u-b's.
    events = await write(redis, keys, settings, INCR, ("u-a", 50), ("u-b", 50), ("u-a", 0))

    result = events[-1].periods["alltime"]
    assert (result.rank, result.previous_rank, result.improved) == (2, 1, False)
    assert result.pulled_in == {"1": "u-b"}
    assert await told(redis, keys, INCR, events[-1], "u-b") == {
        "u-b": [("entered_top", 1, 1, 2, 50)]
    }


@pytest.mark.parametrize("board", [SET, INCR], ids=["set", "incr"])
async def test_a_write_that_rises_or_stays_names_nobody_pulled_in(
    redis: Redis, keys: Keys, settings: LadderSettings, board: Board
) -> None:
    await write(redis, keys, settings, board, ("u-a", 100), ("u-b", 50), ("u-b", 200), ("u-b", 200))
    entries: list[Any] = await redis.xrange(keys.outbox(board.board_id))
    assert len(entries) == 4
    assert all(b"pulled_in" not in fields["e"].encode() for _, fields in entries)


async def test_a_hidden_users_fall_moves_nobody_up(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    """A hidden user is on no board others see (shared/lua/hide.lua), so its fall passes nobody:
    its entry names nobody pulled in, and the shown user's lowered score below then does."""
    await write(redis, keys, settings, SET, ("u-a", 100), ("u-b", 50), ("u-c", 40))
    await redis.sadd(keys.hidden(SET.board_id), "u-a")
    body = ScoreIn(user_id="u-a", region="eu", value=10, occurred_at=second(3))
    await submit(redis, keys, settings, SET, body, "e3")
    entries: list[Any] = await redis.xrevrange(keys.outbox(SET.board_id), count=1)
    hidden = orjson.loads(entries[0][1]["e"])["periods"]["alltime"]
    assert (hidden["rank"], hidden["previous_rank"]) == (3, 1)
    assert "pulled_in" not in hidden
    body = ScoreIn(user_id="u-b", region="eu", value=5, occurred_at=second(4))
    await submit(redis, keys, settings, SET, body, "e4")
    entries = await redis.xrevrange(keys.outbox(SET.board_id), count=1)
    assert orjson.loads(entries[0][1]["e"])["periods"]["alltime"]["pulled_in"] == {"1": "u-c"}


BEST = Board(board_id="battle", operator="best", periods=["alltime"], notify_top=[1, 2])


async def test_each_message_carries_the_score_its_user_held_when_the_batch_moved_it(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    """One batch holds a user overtaken and then back on top by its own write: its
    ``overtaken`` carries the score it was overtaken with, not the one it holds after the
    batch. A board's events are ordered by their outbox entries, however the batch has them."""
    events = await write(
        redis, keys, settings, BEST, ("u-b", 50), ("u-c", 40), ("u-a", 100), ("u-b", 200)
    )
    entries: Any = await redis.xrange(keys.outbox(BEST.board_id))
    # As the relay publishes them: each with its outbox entry's id.
    events = [
        event.model_copy(update={"outbox_id": entry_id})
        for event, (entry_id, _) in zip(events, entries, strict=True)
    ]
    rise, back = events[2], events[3]
    assert rise.periods["alltime"].pushed_out == {"1": "u-b", "2": "u-c"}
    assert back.periods["alltime"].pushed_out == {"1": "u-a"}
    await add_board(redis, keys, BEST)
    async with contextlib.AsyncExitStack() as stack:
        channels = {
            user: await stack.enter_async_context(listening(redis, keys.user_channel(user)))
            for user in ("u-a", "u-b", "u-c")
        }
        # The later event first in the batch: the outbox ids give the order they were written.
        await Notify(redis, keys, BoardCatalog(redis, keys))([back, rise])
        heard = {
            user: sorted(
                (m["reason"], m["top"], m["rank"], m["previous_rank"], m["score"])
                for m in await channel.drain()
            )
            for user, channel in channels.items()
        }
    assert heard == {
        "u-a": [("entered_top", 1, 1, None, 100), ("overtaken", 1, 2, 1, 100)],
        "u-b": [("entered_top", 1, 1, 2, 200), ("overtaken", 1, 2, 1, 50)],
        "u-c": [("overtaken", 2, 3, 2, 40)],
    }
