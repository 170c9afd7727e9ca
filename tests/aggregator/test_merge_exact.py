"""The merge on exact scores (shared/ranking.py): global entries combined from regional ones at
any magnitude, ties in the global view going to whoever reached the score first, to the ms."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from services.aggregator.merge import Merger, Pass
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys, dirty_member
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from tests.helpers import derive_outbox, read_view

T = 10**12


class Game:
    def __init__(self, redis: Redis, settings: LadderSettings, board: Board) -> None:
        self.redis, self.settings, self.board = redis, settings, board
        self.keys = Keys(settings.key_prefix)
        self.start = datetime.now(UTC) - timedelta(seconds=10)
        self.n = 0

    async def post(self, user: str, region: str, value: int, ms: int) -> None:
        """A score reached ``ms`` milliseconds after the game's start, marked for the merge."""
        self.n += 1
        at = self.start + timedelta(milliseconds=ms)
        score = ScoreIn(user_id=user, region=region, value=value, occurred_at=at)
        await submit(self.redis, self.keys, self.settings, self.board, score, f"e{self.n}")
        # Derived (the user's regions, which the merge reads), as the aggregator would.
        await derive_outbox(self.redis, self.keys, self.board, self.settings.feed_length)
        dirty = dirty_member("alltime", "all", region, user)
        await self.redis.sadd(self.keys.dirty(self.board.board_id), dirty)

    async def merged(self) -> list[tuple[str, int]]:
        await Merger(self.redis, self.keys).merge_board(self.board)
        view = self.keys.global_view(self.board.board_id, "alltime", "all")
        return await read_view(self.redis, view, self.board.descending)


@pytest.mark.parametrize(
    ("operator", "expected"),
    [
        # The sum, reached when its latest part was: c (1 ms), b (2 ms), a (3 ms).
        ("incr", [("d", MAX_SCORE), ("c", 12 * T), ("b", 12 * T), ("a", 12 * T)]),
        # The best regional entry and its own reach time; the latest for set.
        ("best", [("d", MAX_SCORE), ("c", 12 * T), ("b", 12 * T), ("a", 6 * T)]),
        ("set", [("d", MAX_SCORE), ("c", 12 * T), ("b", 12 * T), ("a", 6 * T)]),
    ],
)
async def test_the_global_view_holds_exact_scores_and_ties_to_the_millisecond(
    settings: LadderSettings, redis: Redis, operator: str, expected: list[tuple[str, int]]
) -> None:
    board = Board(
        board_id=operator,
        operator=operator,  # type: ignore[arg-type]
        periods=("alltime",),
        min_value=-MAX_SCORE,
        max_value=MAX_SCORE,
    )
    game = Game(redis, settings, board)
    await game.post("a", "eu", 6 * T, 0)
    await game.post("a", "na", 6 * T, 3)
    await game.post("b", "eu", 12 * T, 2)
    await game.post("c", "na", 12 * T, 1)
    await game.post("d", "eu", MAX_SCORE, 5)
    assert await game.merged() == expected


async def test_a_global_sum_past_the_range_stays_at_its_last_exact_total(
    settings: LadderSettings, redis: Redis
) -> None:
    board = Board(board_id="sum", periods=("alltime",), min_value=-MAX_SCORE, max_value=MAX_SCORE)
    game = Game(redis, settings, board)
    # Read densely (as a dense read leaves it): the global view keeps its distinct-score set.
    await redis.sadd(game.keys.dense("sum"), "global")
    await game.post("d", "eu", MAX_SCORE, 0)
    await game.post("e", "eu", -MAX_SCORE, 1)
    assert await game.merged() == [("d", MAX_SCORE), ("e", -MAX_SCORE)]
    view = game.keys.global_view("sum", "alltime", "all")
    records = await redis.hgetall(Keys.ties(view))
    # Each region holds d exactly; their sum would not be: d's global entry stays at its last
    # exact total (as a team's does), neither dropped nor wrapped.
    await game.post("d", "na", 1, 2)
    assert await game.merged() == [("d", MAX_SCORE), ("e", -MAX_SCORE)]
    assert await redis.hgetall(Keys.ties(view)) == records
    assert sorted(await redis.zrange(Keys.distinct(view), 0, -1)) == sorted(
        [str(MAX_SCORE), str(-MAX_SCORE)]
    )
    # Back in range (na's entry taken down below 0): the sum is exact again, and merged.
    await game.post("d", "na", -3, 3)
    assert await game.merged() == [("d", MAX_SCORE - 2), ("e", -MAX_SCORE)]


async def test_a_user_in_two_regions_is_merged_once_however_the_marks_fall(
    settings: LadderSettings, redis: Redis
) -> None:
    """More marks than one merge call takes, each user marked in two regions: each user is
    combined in one call, so the merge counts each once and sums both regions."""
    board = Board(board_id="split", periods=("alltime",))
    game = Game(redis, settings, board)
    users = [f"u{i:03d}" for i in range(300)]
    for i, user in enumerate(users):
        await game.post(user, "eu", 1, i)
        await game.post(user, "na", 2, i)
    merged = await Merger(redis, game.keys).merge_board(board)
    assert merged == len(users)
    view = game.keys.global_view(board.board_id, "alltime", "all")
    assert sorted(await read_view(redis, view, board.descending)) == [(u, 3) for u in users]


async def test_a_mark_the_scan_returns_twice_is_summed_once(
    settings: LadderSettings, redis: Redis
) -> None:
    """``SSCAN`` may return a member twice (a set rehashed during the scan). A round holding a
    mark twice merges its user from each region once: an ``incr`` total is not doubled."""
    board = Board(board_id="twice", periods=("alltime",))
    game = Game(redis, settings, board)
    await game.post("a", "eu", 5, 0)
    await game.post("b", "eu", 1, 1)
    await game.post("b", "na", 2, 2)
    merger = Merger(redis, game.keys)
    assert await merger.lease.hold(board.board_id)
    marks = [
        dirty_member("alltime", "all", region, user)
        for user, region in (("a", "eu"), ("b", "eu"), ("b", "na"))
    ]
    dirty = game.keys.dirty(board.board_id)
    await merger._merge_round(Pass(board), dirty, marks + marks)
    view = game.keys.global_view(board.board_id, "alltime", "all")
    assert await read_view(redis, view, board.descending) == [("a", 5), ("b", 3)]
    assert await redis.scard(dirty) == 0
