"""The merge on exact scores (shared/ranking.py): global entries combined from regional ones at
any magnitude, ties in the global view going to whoever reached the score first, to the ms."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from services.aggregator import merge as merge_module
from services.aggregator.merge import Merger, Pass
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys, dirty_member
from shared.ranking import MAX_SCORE, parse_record
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


async def test_a_global_sum_past_the_range_is_held_at_the_range_end(
    settings: LadderSettings, redis: Redis
) -> None:
    board = Board(board_id="sum", periods=("alltime",), min_value=-MAX_SCORE, max_value=MAX_SCORE)
    game = Game(redis, settings, board)
    # Read densely (as a dense read leaves it): the global view keeps its distinct-score set.
    await redis.sadd(game.keys.dense("sum"), "global")
    await game.post("d", "eu", MAX_SCORE, 0)
    await game.post("e", "eu", -MAX_SCORE, 1)
    assert await game.merged() == [("d", MAX_SCORE), ("e", -MAX_SCORE)]
    # Each region holds d and e exactly; their sums would not be: each global entry is held at
    # the range's end on its side, reached when the latest regional entry was (as an exact sum
    # is), neither dropped nor wrapped, and reported.
    await game.post("d", "na", 1, 5)
    await game.post("e", "na", -1, 2)
    assert await game.merged() == [("d", MAX_SCORE), ("e", -MAX_SCORE)]
    view = game.keys.global_view("sum", "alltime", "all")
    records = await redis.hgetall(Keys.ties(view))
    na = await redis.hgetall(Keys.ties(game.keys.region_view("sum", "alltime", "all", "na")))
    assert {u: parse_record(r)[:2] for u, r in records.items()} == {
        "d": (parse_record(na["d"])[0], MAX_SCORE),
        "e": (parse_record(na["e"])[0], -MAX_SCORE),
    }
    assert sorted(await redis.zrange(Keys.distinct(view), 0, -1)) == sorted(
        [str(MAX_SCORE), str(-MAX_SCORE)]
    )
    # The same writes merged together (as after a rebuild, or at a close) make the same entries.
    again = Game(redis, settings, board.model_copy(update={"board_id": "sum2"}))
    again.start = game.start
    for user, region, value, ms in (
        ("d", "eu", MAX_SCORE, 0),
        ("e", "eu", -MAX_SCORE, 1),
        ("d", "na", 1, 5),
        ("e", "na", -1, 2),
    ):
        await again.post(user, region, value, ms)
    assert await again.merged() == [("d", MAX_SCORE), ("e", -MAX_SCORE)]
    view2 = again.keys.global_view("sum2", "alltime", "all")
    assert await redis.hgetall(Keys.ties(view2)) == records
    # Back in range (na's entry taken down below 0): the sum is exact again, and merged.
    await game.post("d", "na", -3, 6)
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


async def test_a_user_of_two_regions_is_summed_across_rounds_while_the_derive_step_trails(
    settings: LadderSettings, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write alone (nothing derived: no field in the users' regions hash), each user marked
    in two regions, in rounds too small to hold both of a user's marks: each call notes in the
    user's field the regions its marks found a record in, so the call given the other mark reads
    both. A user with a set of the layout before has it folded in; a mark with no record behind
    it (a user erased since) notes nothing."""
    monkeypatch.setattr(merge_module, "ROUND", 20)
    board = Board(board_id="trail", periods=("alltime",))
    keys = Keys(settings.key_prefix)
    users = [f"u{i:03d}" for i in range(60)]
    at = datetime.now(UTC) - timedelta(seconds=10)
    plays = [(u, r, v) for u in users for r, v in (("eu", 1), ("na", 2))]
    for n, (user, region, value) in enumerate([*plays, ("old", "eu", 1), ("old", "ap", 2)]):
        score = ScoreIn(user_id=user, region=region, value=value, occurred_at=at)
        await submit(redis, keys, settings, board, score, f"e{n}")
    await redis.sadd(keys.legacy_user_regions("trail", "old"), "ap")
    marks = [dirty_member("alltime", "all", r, u) for u, r, _ in [*plays, ("old", "eu", 1)]]
    await redis.sadd(keys.dirty("trail"), *marks, dirty_member("alltime", "all", "eu", "gone"))
    await Merger(redis, keys).merge_board(board)
    view = keys.global_view("trail", "alltime", "all")
    assert sorted(await read_view(redis, view, board.descending)) == sorted(
        [(u, 3) for u in [*users, "old"]]
    )
    fields = await redis.hgetall(keys.user_regions("trail"))
    assert fields == {**{u: "eu na" for u in users}, "old": "ap eu"}
    assert not await redis.exists(keys.legacy_user_regions("trail", "old"))
