"""What the aggregator's tickers cost for a board with nothing to do, against real Redis: the
merge pass probes every board in one round trip, merges only those with marks or a merging set
and builds only those with a dense build asked for; the closer, having found nothing due on a
board, looks at it again only when the earliest of its current periods comes due, or once its
definition changes; and the board catalog parses a definition once while its stored text stays
the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from services.aggregator.closer import Closer
from services.aggregator.merge import Merger
from shared.boards import Board, BoardCatalog
from shared.keys import Keys
from shared.periods import PeriodWindow, window_at


async def test_the_merge_probe_names_the_boards_with_work_and_no_other(
    redis: Redis, keys: Keys
) -> None:
    boards = [f"b{i:02}" for i in range(30)]
    await redis.sadd(keys.dirty("b03"), "alltime|all|eu|u-1")
    await redis.sadd(keys.dirty_merging("b11"), "alltime|all|eu|u-2")
    await redis.sadd(keys.dense_build("b27"), "alltime|all|global")

    merger = Merger(redis, keys)
    assert await merger.with_work(boards) == ({"b03", "b11"}, {"b27"})
    assert await merger.with_work([]) == (set(), set())


async def test_a_board_finished_elsewhere_is_behind_no_more(redis: Redis, keys: Keys) -> None:
    """A pass that left a board partway marks it behind, and the ticker goes again at once while
    any board is; if another aggregator (having taken the lease) drains it meanwhile, the probe
    that finds nothing there takes it off, or the ticker would spin."""
    merger = Merger(redis, keys)
    merger.behind.update({"b01", "b02"})
    await redis.sadd(keys.dirty_merging("b02"), "alltime|all|eu|u-2")

    assert await merger.with_work(["b01", "b02"]) == ({"b02"}, set())
    assert merger.behind == {"b02"}


class Counting(Closer):
    """A closer that counts its looks at a board's periods (each one a Redis round trip)."""

    looks = 0

    async def _due(self, board: Board, current: PeriodWindow) -> list[PeriodWindow]:
        self.looks += 1
        return await super()._due(board, current)


async def test_the_closer_looks_at_a_quiet_board_again_only_once_a_period_comes_due(
    redis: Redis, keys: Keys
) -> None:
    board = Board(board_id="quiet", periods=("daily", "weekly", "alltime"))
    closer = Counting(redis, keys, lateness=2, merge_interval=0.2, size=10)
    now = datetime.now(UTC)
    # The first looks close the latest day and week (none closed before; nobody scored), in
    # two steps, a tick each; the third finds nothing due.
    for _ in range(3):
        await closer.close_board(board, now)
    looked = closer.looks

    # Nothing is due now: later ticks make no round trip, until the day ends.
    for seconds in (1, 60, 3600):
        assert await closer.close_board(board, now + timedelta(seconds=seconds)) == 0
    assert closer.looks == looked
    day = window_at("daily", now - timedelta(seconds=3.2), "UTC")
    assert day.end is not None
    await closer.close_board(board, day.end + timedelta(seconds=4))
    assert closer.looks > looked

    # A changed definition is looked at at once.
    looked = closer.looks
    await closer.close_board(board.model_copy(update={"timezone": "Asia/Tokyo"}), now)
    assert closer.looks > looked


async def test_the_catalog_parses_a_definition_once_while_it_stays_the_same(
    redis: Redis, keys: Keys
) -> None:
    catalog = BoardCatalog(redis, keys)
    await catalog.put(Board(board_id="one"))
    await catalog.put(Board(board_id="two"))
    first = await catalog.all()
    again = await catalog.all()
    assert [b.board_id for b in again] == ["one", "two"]
    assert all(a is b for a, b in zip(first, again, strict=True))

    await catalog.put(Board(board_id="two", operator="incr"))
    changed = await catalog.all()
    assert changed[0] is first[0]
    assert changed[1].operator == "incr"
