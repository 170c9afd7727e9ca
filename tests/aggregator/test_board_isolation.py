"""A pass over the boards: one board's failure holds back none sorted after it, in the merge,
the live views and the snapshots (shared/service.py ``board_step``); Redis out of reach fails the
whole pass."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from services.aggregator.live_tracker import LiveViews
from services.aggregator.main import merges
from services.aggregator.merge import Merger
from shared.boards import Board, BoardCatalog
from shared.keys import Keys
from shared.service import board_step, every_board

BOARDS = [Board(board_id="a-broken"), Board(board_id="b-fine")]


class Catalog:
    async def all(self) -> list[Board]:
        return BOARDS


async def test_a_board_whose_merge_fails_holds_back_no_other(redis: Redis, keys: Keys) -> None:
    stop, tried = asyncio.Event(), []

    class Failing(Merger):
        async def with_work(self, boards: list[str]) -> tuple[set[str], set[str]]:
            return set(boards), set()

        async def merge_board(self, board: Board, budget: float | None = None) -> int:
            tried.append(board.board_id)
            if board.board_id == "a-broken":
                raise ValueError("year 10000 is out of range")
            stop.set()
            return 0

    merger = Failing(redis, keys)
    await asyncio.wait_for(merges(merger, cast(BoardCatalog, Catalog()), 0.05, stop), timeout=10)
    assert tried[:2] == ["a-broken", "b-fine"]


async def test_a_board_whose_live_views_fail_holds_back_no_other(redis: Redis, keys: Keys) -> None:
    tried = []

    class Failing(LiveViews):
        async def hot(self, board: Board, now: datetime | None = None) -> int:
            tried.append(board.board_id)
            if board.board_id == "a-broken":
                raise ValueError("year 10000 is out of range")
            return 1

        async def mvps(self, board: Board, now: datetime | None = None) -> int:
            return 0

    assert await Failing(redis, keys).tick(BOARDS) == 1
    assert tried == ["a-broken", "b-fine"]


def test_redis_out_of_reach_fails_the_whole_pass() -> None:
    with pytest.raises(RedisConnectionError), board_step(BOARDS[0], "merge"):
        raise RedisConnectionError("Connection refused")


async def test_a_board_whose_snapshot_fails_holds_back_no_other() -> None:
    # every_board, which the snapshotter's pass runs on.
    stop, tried = asyncio.Event(), []

    async def take(board: Board) -> None:
        tried.append(board.board_id)
        if board.board_id == "a-broken":
            raise IndexError("a record of the layout before")
        stop.set()

    await asyncio.wait_for(every_board(cast(BoardCatalog, Catalog()), 0.05, stop, take), 10)
    assert tried[:2] == ["a-broken", "b-fine"]
