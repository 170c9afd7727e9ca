"""Operators and orders on the write path, each rule on its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.ranking import SubscoreOrder
from shared.settings import LadderSettings
from tests.api.test_reads import merge
from tests.helpers import read_view


class Game:
    """Writes to one board at chosen moments and reads its region back in rank order."""

    def __init__(self, redis: Redis, settings: LadderSettings, board: Board) -> None:
        self.redis, self.settings, self.board = redis, settings, board
        self.keys = Keys(settings.key_prefix)
        self.n = 0
        # Each game's clock starts when it is made, five minutes back: a start fixed when the
        # module loads could be older than the allowed lateness by the time a long run gets here.
        self.start = datetime.now(UTC) - timedelta(seconds=300)

    async def post(
        self, user: str, value: int, second: int, region: str = "eu", subscore: int | None = None
    ) -> dict[str, Any]:
        self.n += 1
        score = ScoreIn(
            user_id=user,
            region=region,
            value=value,
            occurred_at=self.start + timedelta(seconds=second),
            subscore=subscore,
        )
        answer = await submit(self.redis, self.keys, self.settings, self.board, score, f"e{self.n}")
        return dict(answer["periods"]["alltime"])

    async def order(self) -> list[tuple[str, int]]:
        key = self.keys.region_view(self.board.board_id, "alltime", "all", "eu")
        return await read_view(self.redis, key, self.board.descending)


async def test_a_personal_best_only_goes_up(settings: LadderSettings, redis: Redis) -> None:
    game = Game(redis, settings, Board(board_id="best", operator="best"))
    assert (await game.post("ana", 50, 1))["improved"] is True
    worse = await game.post("ana", 30, 2)
    assert (worse["score"], worse["improved"]) == (50, False)
    better = await game.post("ana", 70, 3)
    assert (better["score"], better["improved"]) == (70, True)
    assert await game.order() == [("ana", 70)]


async def test_equal_bests_rank_the_earlier_first(settings: LadderSettings, redis: Redis) -> None:
    game = Game(redis, settings, Board(board_id="best", operator="best"))
    await game.post("zed", 60, 1)  # reached 60 first; "zed" sorts after "amy" by name
    await game.post("amy", 60, 5)
    await game.post("zed", 60, 9)  # an equal later best does not replace the first
    assert await game.order() == [("zed", 60), ("amy", 60)]
    again = await game.post("zed", 60, 10)
    assert again["improved"] is False and again["rank"] == 1


async def test_an_ascending_board_keeps_the_lowest(settings: LadderSettings, redis: Redis) -> None:
    game = Game(redis, settings, Board(board_id="speedrun", operator="best", order="asc"))
    await game.post("ana", 93_000, 1)
    await game.post("bo", 88_000, 2)
    slower = await game.post("ana", 99_000, 3)
    assert (slower["score"], slower["improved"], slower["rank"]) == (93_000, False, 2)
    faster = await game.post("ana", 81_000, 4)
    assert (faster["score"], faster["rank"], faster["previous_rank"]) == (81_000, 1, 2)
    assert await game.order() == [("ana", 81_000), ("bo", 88_000)]


async def test_set_keeps_the_latest(settings: LadderSettings, redis: Redis) -> None:
    game = Game(redis, settings, Board(board_id="level", operator="set"))
    await game.post("ana", 40, 1)
    lower = await game.post("ana", 12, 2)
    assert (lower["score"], lower["improved"]) == (12, True)
    assert await game.order() == [("ana", 12)]


async def test_equal_incr_totals_rank_whoever_reached_them_first(
    settings: LadderSettings, redis: Redis
) -> None:
    game = Game(redis, settings, Board(board_id="race"))
    await game.post("zed", 10, 1)
    await game.post("amy", 4, 2)
    await game.post("amy", 6, 3)  # amy reaches 10 at second 3; zed had it at second 1
    assert await game.order() == [("zed", 10), ("amy", 10)]
    await game.post("zed", 1, 4)
    await game.post("zed", -1, 5)  # back to 10, reached at second 5: now amy was first
    assert await game.order() == [("amy", 10), ("zed", 10)]


# --- late events: each rule goes by when the events happened, not by when they came in --------


async def test_a_late_increment_does_not_make_a_total_reached_earlier(
    settings: LadderSettings, redis: Redis
) -> None:
    game = Game(redis, settings, Board(board_id="race"))
    await game.post("zed", 50, 20)
    await game.post("amy", 100, 10)  # amy reaches 100 at second 10
    late = await game.post("zed", 50, 0)  # happened first, came last: zed reaches 100 at 20
    assert (late["score"], late["improved"], late["rank"]) == (100, True, 2)
    assert await game.order() == [("amy", 100), ("zed", 100)]


async def test_an_increment_of_zero_makes_the_total_reached_when_it_happened(
    settings: LadderSettings, redis: Redis
) -> None:
    """A total is reached when its last increment happened, one of 0 too: so the order events
    come in never decides which of two equal totals was reached first."""
    game = Game(redis, settings, Board(board_id="race"))
    await game.post("zed", 10, 1)
    await game.post("amy", 10, 2)
    zero = await game.post("zed", 0, 3)
    assert (zero["score"], zero["improved"], zero["rank"], zero["previous_rank"]) == (
        10,
        False,
        2,
        1,
    )
    assert await game.order() == [("amy", 10), ("zed", 10)]
    assert (await game.post("amy", 0, 0))["rank"] == 1  # late: amy's total stays reached at 2


async def test_a_late_equal_best_makes_the_best_reached_earlier(
    settings: LadderSettings, redis: Redis
) -> None:
    game = Game(redis, settings, Board(board_id="best", operator="best"))
    await game.post("zed", 60, 20)
    await game.post("amy", 60, 10)
    late = await game.post("zed", 60, 0)  # zed had 60 at second 0, before amy
    # The best did not change, so it is no improvement; the rank read after the write moved.
    assert (late["score"], late["improved"]) == (60, False)
    assert (late["rank"], late["previous_rank"]) == (1, 2)
    assert await game.order() == [("zed", 60), ("amy", 60)]
    # An equal best that happened later still changes nothing.
    assert (await game.post("zed", 60, 30))["rank"] == 1
    assert await game.order() == [("zed", 60), ("amy", 60)]


async def test_a_late_set_does_not_replace_a_later_one(
    settings: LadderSettings, redis: Redis
) -> None:
    game = Game(redis, settings, Board(board_id="level", operator="set"))
    await game.post("ana", 10, 20)
    stale = await game.post("ana", 30, 0)
    assert (stale["score"], stale["improved"], stale["rank"]) == (10, False, 1)
    assert await game.order() == [("ana", 10)]
    newer = await game.post("ana", 5, 25)
    assert (newer["score"], newer["improved"]) == (5, True)


async def test_a_late_set_in_another_region_is_not_the_global_latest(
    settings: LadderSettings, redis: Redis
) -> None:
    """The global entry on set is the regional one reached last; a late set written after the
    newer one, in the same region or another, leaves the newer one global."""
    board = Board(board_id="rating", operator="set")
    game = Game(redis, settings, board)
    await game.post("one", 10, 20, "eu")
    await game.post("one", 30, 0, "eu")
    await game.post("two", 10, 20, "eu")
    await game.post("two", 30, 0, "na")
    await merge(redis, game.keys, board)
    world = game.keys.global_view("rating", "alltime", "all")
    assert sorted(await read_view(redis, world, True)) == [("one", 10), ("two", 10)]


@pytest.mark.parametrize("sub_order", [None, "desc"])
async def test_a_late_set_does_not_replace_a_later_write_of_the_same_score(
    settings: LadderSettings, redis: Redis, sub_order: SubscoreOrder | None
) -> None:
    """Setting the score it holds again keeps an entry's first reach time, for ties, but a set
    that happened before that later write is late all the same: it does not replace the
    score, on a board with a subscore (the same pair set again) as on one without."""
    game = Game(redis, settings, Board(board_id="level", operator="set", subscore_order=sub_order))
    sub = 0 if sub_order else None
    await game.post("ana", 4, 0, subscore=sub)
    await game.post("bo", 4, 10, subscore=sub)
    again = await game.post("ana", 4, 50, subscore=sub)
    assert (again["score"], again["improved"], again["rank"]) == (4, False, 1)
    late = await game.post("ana", 3, 20, subscore=sub)
    assert (late["score"], late["improved"], late["rank"]) == (4, False, 1)
    # ana still reached 4 first (second 0), before bo (second 10).
    assert await game.order() == [("ana", 4), ("bo", 4)]
    # A set after the latest write still replaces it.
    newer = await game.post("ana", 3, 60, subscore=sub)
    assert (newer["score"], newer["improved"], newer["rank"]) == (3, True, 2)


async def test_the_global_set_is_the_regional_score_written_last(
    settings: LadderSettings, redis: Redis
) -> None:
    """The global entry on set is the regional one written last, by when it happened: a region
    whose score was set again, to the same score, after another region's set holds the global
    entry, with the reach time of its score's first reach."""
    board = Board(board_id="rating", operator="set")
    game = Game(redis, settings, board)
    await game.post("one", 4, 0, "eu")
    await game.post("one", 3, 20, "na")
    await game.post("one", 4, 50, "eu")  # eu's 4 again, written after na's 3
    await game.post("two", 4, 10, "eu")
    await merge(redis, game.keys, board)
    world = game.keys.global_view("rating", "alltime", "all")
    assert await read_view(redis, world, True) == [("one", 4), ("two", 4)]
