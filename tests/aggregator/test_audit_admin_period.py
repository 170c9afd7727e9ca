"""A period closed with users hidden on its board (docs/api.md section 8b, "Period ends" and
"Hiding a user"), against the real Redis: the final tops leave them out, and a period only they
scored in closes without a message, as one nobody scored in does."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from redis.asyncio import Redis

from services.aggregator.closer import Closer
from services.aggregator.merge import Merger
from services.api.write.models import ScoreIn
from services.api.write.submit import submit
from shared.boards import Board
from shared.keys import Keys
from shared.periods import close_name, window_at
from shared.settings import LadderSettings
from tests.helpers import catalog_of


async def closed(
    redis: Redis, keys: Keys, settings: LadderSettings, board: Board, scores: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    """The period.closed messages of ``board``'s season once it is closed, after ``scores``
    (user ``h`` hidden on the board from the start, the others not)."""
    settings = settings.model_copy(update={"allowed_lateness": 60.0})
    now = datetime.now(UTC)
    season = window_at("season", now, "UTC", board.schedule)
    assert season.end is not None
    await redis.sadd(keys.hidden(board.board_id), "h")
    for n, (user, value) in enumerate(scores):
        score = ScoreIn(user_id=user, region="eu", value=value, occurred_at=now)
        await submit(redis, keys, settings, board, score, f"e-{n}")
    await catalog_of(redis, keys, [board.board_id])  # a close writes for a defined board alone
    closer, merger = (
        Closer(redis, keys, lateness=2, merge_interval=0.2, size=100, outbox_max=100),
        Merger(redis, keys),
    )
    after = season.end + timedelta(seconds=5)
    for _ in range(10):
        await closer.close_board(board, after)
        await merger.merge_board(board)
        await asyncio.sleep(0)
    claim = keys.period_closed(board.board_id, "season", close_name(season))
    assert await redis.exists(claim), "the season is closed"
    return [
        orjson.loads(fields["m"])
        for _, fields in await redis.xrange(keys.periods_outbox(board.board_id))
    ]


async def test_a_period_only_hidden_users_scored_in_closes_without_a_message(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    board = Board(
        board_id="solo", operator="best", schedule="* * * * *", periods=("season",), regions=("eu",)
    )
    assert await closed(redis, keys, settings, board, [("h", 50)]) == []


async def test_the_final_tops_leave_a_hidden_user_out(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    board = Board(
        board_id="duo", operator="best", schedule="* * * * *", periods=("season",), regions=("eu",)
    )
    [body] = await closed(redis, keys, settings, board, [("h", 50), ("a", 30), ("b", 20)])
    ranked = {s: [(e["user_id"], e["rank"]) for e in es] for s, es in body["scopes"].items()}
    assert ranked == {"global": [("a", 1), ("b", 2)], "region:eu": [("a", 1), ("b", 2)]}
