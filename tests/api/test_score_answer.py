"""The answer to a score (docs/api.md section 4): every period, ranks within a region, ties."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from shared.boards import Board
from shared.keys import Keys
from shared.settings import LadderSettings
from tests.api.helpers import (
    LEADERBOARD,
    PERIOD_ID_FORMATS,
    SCORES,
    add_board,
    ago,
    assert_problem,
    get_ok,
    period_ids,
    post,
    rfc,
    score,
)
from tests.helpers import ADMIN, SERVER, api_client, player

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


async def test_a_first_score_answers_every_period(quiet: LadderSettings) -> None:
    at = datetime.now(UTC) - timedelta(seconds=5)
    body = score(
        event_id="c0ffee-42",
        user_id="u-42",
        value=25,
        team_id="red-wombats",
        display_name="Ana",
        occurred_at=rfc(at),
    )
    async with api_client(quiet) as client:
        answer = await post(client, body)

    assert answer == {
        "event_id": "c0ffee-42",
        "duplicate": False,
        "board_id": "main",
        "user_id": "u-42",
        "region": "eu",
        "periods": {
            name: {
                "period_id": period_id,
                "score": 25,
                "rank": 1,
                "previous_rank": None,
                "improved": True,
            }
            for name, period_id in period_ids(at).items()
        },
    }
    for name, pattern in PERIOD_ID_FORMATS.items():
        assert re.fullmatch(pattern, answer["periods"][name]["period_id"])


async def test_ranks_follow_totals_within_a_region(quiet: LadderSettings) -> None:
    # One moment for every event, so that no period can turn over halfway through.
    at = datetime.now(UTC) - timedelta(seconds=5)

    def scored(user_id: str, value: int, region: str = "eu") -> dict[str, Any]:
        return score(user_id=user_id, value=value, region=region, occurred_at=rfc(at))

    async with api_client(quiet) as client:
        a = await post(client, scored("u-a", 10))
        b = await post(client, scored("u-b", 20))
        c = await post(client, scored("u-c", 30))
        elsewhere = await post(client, scored("u-na", 1000, region="na"))
        ranked = await get_ok(client, LEADERBOARD, scope="region:eu")
        # incr adds up: 10 + 25 = 35 takes u-a from third to first.
        climb = await post(client, scored("u-a", 25))
        nothing = await post(client, scored("u-b", 0))
        after = await get_ok(
            client,
            LEADERBOARD,
            scope="region:eu",
            period="daily",
            period_id=period_ids(at)["daily"],
        )

    for answer in (a, b, c, elsewhere):
        assert {p["rank"] for p in answer["periods"].values()} == {1}
        assert {p["previous_rank"] for p in answer["periods"].values()} == {None}
    assert [(e["rank"], e["user_id"], e["score"]) for e in ranked["entries"]] == [
        (1, "u-c", 30),
        (2, "u-b", 20),
        (3, "u-a", 10),
    ]
    assert ranked["total"] == 3
    for period in climb["periods"].values():
        assert (period["score"], period["rank"], period["previous_rank"]) == (35, 1, 3)
        assert period["improved"] is True
    for period in nothing["periods"].values():
        assert (period["score"], period["rank"], period["previous_rank"]) == (20, 3, 3)
        assert period["improved"] is False
    assert [(e["rank"], e["user_id"], e["score"]) for e in after["entries"]] == [
        (1, "u-a", 35),
        (2, "u-c", 30),
        (3, "u-b", 20),
    ]


async def test_equal_totals_rank_whoever_reached_them_first(quiet: LadderSettings) -> None:
    now = datetime.now(UTC)
    earlier, later = now - timedelta(seconds=30), now - timedelta(seconds=20)
    # tie-b sorts after tie-a: a tie broken by user id rather than time would put tie-b first.
    async with api_client(quiet) as client:
        await post(client, score(user_id="tie-a", value=15, occurred_at=ago(40)))
        await post(client, score(user_id="tie-a", value=25, occurred_at=rfc(earlier)))
        second = await post(client, score(user_id="tie-b", value=40, occurred_at=rfc(later)))
        # The alltime period ticks in minutes (see the test below); the others in ms.
        shared = [
            p
            for p in ("daily", "weekly", "monthly")
            if period_ids(earlier)[p] == period_ids(later)[p]
        ]
        boards = {
            p: await get_ok(
                client, LEADERBOARD, scope="region:eu", period=p, period_id=period_ids(later)[p]
            )
            for p in shared
        }

    assert shared, "earlier and later always share the week or the month"
    for period in shared:
        entries = [(e["rank"], e["user_id"], e["score"]) for e in boards[period]["entries"]]
        assert entries == [(1, "tie-a", 40), (2, "tie-b", 40)], period
        assert second["periods"][period]["rank"] == 2, period


async def test_equal_alltime_totals_within_one_minute_rank_whoever_was_first(
    quiet: LadderSettings,
) -> None:
    minute = (datetime.now(UTC) - timedelta(seconds=150)).replace(second=0, microsecond=0)
    earlier, later = minute + timedelta(seconds=10), minute + timedelta(seconds=40)
    async with api_client(quiet) as client:
        await post(client, score(user_id="tie-a", value=40, occurred_at=rfc(earlier)))
        await post(client, score(user_id="tie-b", value=40, occurred_at=rfc(later)))
        board = await get_ok(client, LEADERBOARD, scope="region:eu", period="alltime")

    entries = [(e["rank"], e["user_id"], e["score"]) for e in board["entries"]]
    assert entries == [(1, "tie-a", 40), (2, "tie-b", 40)]


async def test_an_admin_key_may_submit_for_any_user(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        answer = await post(client, score(user_id="u-5", value=4), ADMIN)

    assert (answer["user_id"], answer["periods"]["alltime"]["score"]) == ("u-5", 4)


async def test_a_player_submits_its_own_score_on_a_board_with_player_writes(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    await add_board(redis, keys, Board(board_id="open", player_writes=True, regions=("eu",)))
    async with api_client(quiet) as client:
        answer = await post(client, score(user_id="u-7", value=3), player("u-7"), board="open")

    assert answer["board_id"] == "open"
    assert answer["periods"]["alltime"]["score"] == 3


async def test_an_unlabelled_json_body_is_read(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        response = await client.post(SCORES, content=orjson.dumps(score()), headers=SERVER)

    assert response.status_code == 200, response.text


async def test_a_json_body_labelled_text_plain_is_read(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        response = await client.post(
            SCORES, content=orjson.dumps(score()), headers=SERVER | {"Content-Type": "text/plain"}
        )

    assert response.status_code == 200, response.text


async def test_a_single_post_checks_its_credential_then_its_path(
    quiet: LadderSettings,
) -> None:
    """The single POST reads its path itself (no FastAPI parameter): after the credential, a
    malformed board id is one 422 naming the path alone, before the body is looked at; a
    well-formed board that does not exist is a 404 before it."""
    async with api_client(quiet) as client:
        malformed = await client.post("/v1/boards/Not_A_Board/scores", content=b"{", headers=SERVER)
        missing = await client.post("/v1/boards/nowhere/scores", content=b"{", headers=SERVER)
        accepted = await client.post("/v1/boards/main/scores", json=score(), headers=SERVER)

    body = assert_problem(malformed, 422)
    assert [(e["loc"], e["type"]) for e in body["errors"]] == [
        (["path", "board_id"], "string_pattern_mismatch")
    ]
    assert_problem(missing, 404)
    assert accepted.status_code == 200, accepted.text
