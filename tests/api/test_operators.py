"""Operators and orders on the write path, each rule on its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis

from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.settings import LadderSettings
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

    async def post(self, user: str, value: int, second: int) -> dict[str, Any]:
        self.n += 1
        score = ScoreIn(
            user_id=user,
            region="eu",
            value=value,
            occurred_at=self.start + timedelta(seconds=second),
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
