"""Late events count toward the period of their own ``occurred_at`` (docs/api.md section 4),
held against the model of tests/api/test_audit_reads_model.py on a board of minute seasons.

A season a minute (``"* * * * *"``) puts the events of the last five minutes, sent in random
order, into several periods at once: each answer's ``season`` part must be the user's place in
the season of its own ``occurred_at``, and each season read back (its regions page by page, its
global view once merged) must be that season's model, as must the all-time view that holds them
all.
"""

from __future__ import annotations

import copy
import os
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.boards import Board
from shared.keys import Keys
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from tests.api.helpers import add_board, rfc
from tests.api.test_audit_reads_model import (
    REGIONS,
    STYLES,
    USERS,
    Model,
    Row,
    aggregate,
    as_row,
    draw,
    read_pages,
    styled,
)
from tests.helpers import SERVER, api_client

SEEDS = [int(s) for s in os.environ.get("LADDER_AUDIT_SEEDS", "5,6,8").split(",")]


def season_of(at: int) -> str:
    return datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%dT%H:%M")


def place(model: Model, region: str, user: str) -> tuple[int | None, list[Row]]:
    rows = model.ranked(model.regions.get(region, {}))
    names = [row[0] for row in rows]
    return (names.index(user) + 1 if user in names else None), rows


async def post(
    client: httpx.AsyncClient, models: dict[str, Model], board: str, body: dict[str, Any], at: int
) -> None:
    """One event, its answer for the season and all time held against their models."""
    wants: dict[str, Any] = {}
    kept = copy.deepcopy(models)
    for period, key in (("season", season_of(at)), ("alltime", "all")):
        model = models.setdefault(key, Model(models["all"].operator, models["all"].order, None))
        previous, _ = place(model, body["region"], body["user_id"])
        changed = model.apply(body["region"], body["user_id"], body["value"], None, at, None)
        if changed is None:  # past the range in one period: the event writes nothing
            models.clear()
            models.update(kept)
            wants = {}
            break
        rank, rows = place(model, body["region"], body["user_id"])
        assert rank is not None
        wants[period] = {"period_id": key, "score": rows[rank - 1][1], "rank": rank,
                         "previous_rank": previous, "improved": changed}  # fmt: skip
    response = await client.post(f"/v1/boards/{board}/scores", json=body, headers=SERVER)
    if not wants:  # a total past the range: refused, nothing written (in either period)
        assert response.status_code == 422, response.text
        return
    assert response.status_code == 200, response.text
    assert response.json()["periods"] == wants, body


async def check(
    client: httpx.AsyncClient, rng: random.Random, board: str, key: str, model: Model
) -> None:
    period = {"period": "alltime"} if key == "all" else {"period": "season", "period_id": key}
    views = {f"region:{r}": model.ranked(b) for r, b in model.regions.items()}
    views["global"] = model.ranked(model.merged())
    first = await client.get(f"/v1/boards/{board}/leaderboard", params=period)
    assert first.status_code == 200, first.text
    ends = None
    if key != "all":  # a minute season ends at the next minute
        start = datetime.strptime(key, "%Y-%m-%dT%H:%M").replace(tzinfo=UTC)
        ends = (start + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert (first.json()["period_id"], first.json()["period_ends_at"]) == (key, ends)
    for scope, expected in views.items():
        style = rng.choice(STYLES)
        params = {"scope": scope, "rank_style": style, **period}
        entries, total = await read_pages(client, f"/v1/boards/{board}/leaderboard", rng, params)
        assert total == len(expected), (key, scope)
        assert [as_row(e) for e in entries] == expected, (key, scope)
        assert [e["rank"] for e in entries] == styled(expected, style), (key, scope)


@pytest.mark.parametrize("seed", SEEDS)
async def test_late_events_count_in_the_season_they_happened_in(
    quiet: LadderSettings, redis: Redis, keys: Keys, seed: int
) -> None:
    rng = random.Random(seed)
    operator = rng.choice(["incr", "best", "set"])
    board = Board.model_validate(
        {
            "board_id": f"seasons-{seed}",
            "operator": operator,
            "order": rng.choice(["desc", "asc"]),
            "periods": ["alltime"],
            "schedule": "* * * * *",
            "retention": {"daily": 35, "weekly": 12, "monthly": 12, "season": 30},
            "min_value": -MAX_SCORE,
            "max_value": MAX_SCORE,
        }
    )
    await add_board(redis, keys, board)
    models = {"all": Model(operator, board.order, None)}
    now = datetime.now(UTC)
    # Moments across the last five minutes, a few on a minute's first and last millisecond.
    edge = now.replace(second=0, microsecond=0) - timedelta(minutes=2)
    moments = [int((now - timedelta(seconds=rng.uniform(1, 300))).timestamp() * 1000)]
    moments += [int(edge.timestamp() * 1000), int(edge.timestamp() * 1000) - 1]
    moments += [int((now - timedelta(seconds=rng.uniform(1, 300))).timestamp() * 1000)]
    loose = quiet.model_copy(update={"user_rate": 1e9, "key_rate": 1e9})
    async with api_client(loose) as client:
        for n in range(40):
            at = rng.choice(moments)
            body = {
                "event_id": f"s{n}",
                "user_id": rng.choice(USERS),
                "region": rng.choice(REGIONS[:2]),
                "value": draw(rng, operator),
                "occurred_at": rfc(datetime.fromtimestamp(at / 1000, UTC)),
            }
            await post(client, models, board.board_id, body, at)
        await aggregate(redis, keys, board)
        assert len(models) >= 3  # all time and at least two seasons
        for key, model in models.items():
            await check(client, rng, board.board_id, key, model)
