"""The outbox entry and the answer as the write builds them (shared/lua/write.lua): each period's
result, whom a move pushed out of each bracket it crossed, the entry's previous score and
subscore, and a duplicate answered from the record as the first was."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.settings import LadderSettings

BOARD = Board(
    board_id="brackets",
    periods=["daily", "alltime"],
    operator="best",
    notify_top=[1, 2, 3, 10],
    subscore_order="desc",
)


async def post(
    redis: Redis, keys: Keys, settings: LadderSettings, user: str, value: int, sub: int
) -> dict[str, Any]:
    body = ScoreIn(user_id=user, region="eu", value=value, subscore=sub)
    return await submit(redis, keys, settings, BOARD, body, f"{user}-{value}")


async def newest_entry(redis: Redis, keys: Keys) -> dict[str, Any]:
    entries: list[Any] = await redis.xrevrange(keys.outbox(BOARD.board_id), count=1)
    return orjson.loads(entries[0][1]["e"])


async def test_a_move_names_whom_it_pushed_out_of_every_bracket_it_crossed(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    for user, value in (("u-a", 40), ("u-b", 30), ("u-c", 20), ("u-d", 10)):
        await post(redis, keys, settings, user, value, 7)

    answer = await post(redis, keys, settings, "u-d", 50, 9)

    entry = await newest_entry(redis, keys)
    for name in ("daily", "alltime"):
        result = entry["periods"][name]
        assert result | {"period_id": ""} == {
            "period_id": "",
            "score": 50,
            "rank": 1,
            "previous_rank": 4,
            "improved": True,
            # From 4th to 1st: out of the top 3, 2 and 1 went the 3rd, 2nd and 1st; the top 10
            # was not crossed.
            "pushed_out": {"1": "u-a", "2": "u-b", "3": "u-c"},
            "previous_score": 10,
            "previous_subscore": 7,
        }
        assert answer["periods"][name] == {
            k: v
            for k, v in result.items()
            if k in ("period_id", "score", "rank", "previous_rank", "improved")
        }
    again = await post(redis, keys, settings, "u-d", 50, 9)
    assert again == answer | {"duplicate": True}


async def test_an_unchanged_entry_pushes_nobody_and_names_no_previous_pair(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    await post(redis, keys, settings, "u-a", 40, 7)
    await post(redis, keys, settings, "u-b", 30, 7)

    answer = await post(redis, keys, settings, "u-b", 20, 7)

    entry = await newest_entry(redis, keys)
    assert entry["periods"]["alltime"] | {"period_id": ""} == {
        "period_id": "",
        "score": 30,
        "rank": 2,
        "previous_rank": 2,
        "improved": False,
        "pushed_out": {},
    }
    assert answer["periods"]["alltime"]["improved"] is False
