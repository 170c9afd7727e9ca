"""The API in-process against real Redis (and MySQL and RabbitMQ where a test needs them).

API.md sections 1, 2, 4, 5, 7, 9a and 10: every error is problem+json and changes no state;
idempotency; the shape and ranks of a score answer; reads, pages and standings; credentials;
the operations endpoints.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import re
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from services.history.handlers import HistoryHandler
from shared.boards import Board
from shared.db import open_engine
from shared.events import ScoreAccepted
from shared.keys import Keys
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import (
    ADMIN,
    SERVER,
    UNREACHABLE_BROKER,
    api_client,
    bearer,
    eventually,
    player,
    player_token,
    snapshot,
)

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

SCORES = "/v1/boards/main/scores"
LEADERBOARD = "/v1/boards/main/leaderboard"
JSON = {"Content-Type": "application/json"}
PROBLEM = "application/problem+json"
MiB = 1024 * 1024

# Board main as API.md section 3 defines it, every field present.
MAIN = {
    "board_id": "main",
    "operator": "incr",
    "order": "desc",
    "periods": ["daily", "weekly", "monthly", "alltime"],
    "timezone": "UTC",
    "min_value": -1_000_000,
    "max_value": 1_000_000,
    "retention": {"daily": 35, "weekly": 12, "monthly": 12},
    "notify_top": [1, 10, 100],
    "player_writes": False,
    "badges": {},
}
PERIOD_ID_FORMATS = {
    "daily": r"^\d{4}-\d{2}-\d{2}$",
    "weekly": r"^\d{4}-W\d{2}$",
    "monthly": r"^\d{4}-\d{2}$",
    "alltime": r"^all$",
}
DROP: Any = object()


# --- helpers ---------------------------------------------------------------------------------


def score(**fields: Any) -> dict[str, Any]:
    """A valid score body for user u-1 in region eu; ``name=DROP`` leaves a field out."""
    body: dict[str, Any] = {"user_id": "u-1", "region": "eu", "value": 5}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not DROP}


def rfc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def ago(seconds: float) -> str:
    return rfc(datetime.now(UTC) - timedelta(seconds=seconds))


def period_ids(moment: datetime) -> dict[str, str]:
    """The period ids of a UTC board at ``moment``, worked out independently of shared.periods."""
    day = moment.astimezone(UTC).date()
    year, week, _ = day.isocalendar()
    return {
        "daily": day.isoformat(),
        "weekly": f"{year}-W{week:02d}",
        "monthly": f"{day:%Y-%m}",
        "alltime": "all",
    }


async def post(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    board: str = "main",
) -> dict[str, Any]:
    """Submit a score that must be accepted; its answer."""
    response = await client.post(
        f"/v1/boards/{board}/scores", json=body, headers=SERVER if headers is None else headers
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def get_ok(client: httpx.AsyncClient, path: str, **params: Any) -> dict[str, Any]:
    response = await client.get(path, params=params, headers=SERVER)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def add_board(redis: Redis, keys: Keys, board: Board) -> None:
    """Store a board definition where the catalog reads it (boards have no write route yet)."""
    await redis.hset(keys.boards, board.board_id, board.model_dump_json())


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys(), body
    assert body["status"] == status
    for name in ("type", "title", "detail"):
        assert isinstance(body[name], str) and body[name], body
    if status == 422:
        assert isinstance(body.get("errors"), list) and body["errors"], body
    if status in (429, 503):
        assert int(response.headers["retry-after"]) >= 1
    if status == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")
    return body


@pytest.fixture
def quiet(settings: LadderSettings) -> LadderSettings:
    """The test's settings with an unreachable broker: accepted events stay in the outbox and
    nothing but the requests themselves changes Redis."""
    return settings.model_copy(
        update={"amqp_url": UNREACHABLE_BROKER, "shutdown_grace_seconds": 1.0}
    )


# --- 1. every error is a problem and changes nothing -----------------------------------------

Setup = Callable[[httpx.AsyncClient, Redis, Keys], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    status: int
    method: str = "POST"
    path: str = SCORES
    params: dict[str, Any] = field(default_factory=dict)
    # A JSON body made at request time (times are relative to now), or raw content.
    body: Callable[[], Any] | None = score
    content: Callable[[], bytes | AsyncIterator[bytes]] | None = None
    headers: Callable[[], dict[str, str]] = lambda: dict(SERVER)
    setup: Setup | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    # For 422: a name that some error's ``loc`` must end with.
    loc: str | None = None


def read(path: str, **params: Any) -> dict[str, Any]:
    return {"method": "GET", "path": path, "params": params, "body": None}


def lb(**params: Any) -> dict[str, Any]:
    return read(LEADERBOARD, **({"scope": "region:eu"} | params))


def raw(content: bytes, content_type: str | None = "application/json") -> dict[str, Any]:
    def headers() -> dict[str, str]:
        return SERVER | ({"Content-Type": content_type} if content_type else {})

    return {"body": None, "content": lambda: content, "headers": headers}


async def streamed_oversize() -> AsyncIterator[bytes]:
    """1.1 MiB of a JSON body without a Content-Length, in 64 KiB chunks."""
    yield b'{"user_id": "u-1", "region": "eu", "value": 5, "display_name": "'
    for _ in range(18):
        yield b"x" * (64 * 1024)
    yield b'"}'


def oversize() -> bytes:
    return orjson.dumps(score(padding="x" * int(1.1 * MiB)))


async def open_board(_: httpx.AsyncClient, redis: Redis, keys: Keys) -> None:
    await add_board(redis, keys, Board(board_id="open", player_writes=True))


async def alltime_board(_: httpx.AsyncClient, redis: Redis, keys: Keys) -> None:
    await add_board(redis, keys, Board(board_id="forever", periods=("alltime",)))


def posting(*bodies: dict[str, Any]) -> Setup:
    async def setup(client: httpx.AsyncClient, _: Redis, __: Keys) -> None:
        for body in bodies:
            await post(client, body)

    return setup


class NearAlltimeMax:
    """Setup and body of a write that would take an all-time score past its encodable range."""

    def __init__(self) -> None:
        self.at = ""

    def body(self) -> dict[str, Any]:
        return score(user_id="u-big", value=1_000_000, occurred_at=self.at)

    async def setup(self, client: httpx.AsyncClient, redis: Redis, keys: Keys) -> None:
        # 8 x 1,000,000, and the next million passes the all-time range of 2**23 - 1 = 8,388,607,
        # the narrowest of the four periods.
        self.at = ago(5)
        for _ in range(8):
            await post(client, self.body())


NEAR_ALLTIME_MAX = NearAlltimeMax()


def nan_cursor() -> str:
    raw_cursor = orjson.dumps({"c": "nan", "u": "u-seed"})
    return base64.urlsafe_b64encode(raw_cursor).decode().rstrip("=")


LAST_WEEK = period_ids(datetime.now(UTC) - timedelta(days=7))["weekly"]

ERROR_CASES = [
    # 400 malformed JSON
    pytest.param(Case(400, **raw(b'{"user_id": "u-1",')), id="400-malformed-json"),
    pytest.param(Case(400, **raw(b'{"user_id": "u-1",', None)), id="400-malformed-unlabelled"),
    pytest.param(
        Case(400, **raw(b'{"user_id": "u-1",', "text/plain")),
        id="400-malformed-text-plain",
    ),
    pytest.param(Case(400, **raw(b'{"user_id": "\xff\xfe"}')), id="400-not-utf8"),
    pytest.param(Case(400, **raw(b"[" * 100_000 + b"]" * 100_000)), id="400-nested-too-deep"),
    # 401 missing or invalid credential
    pytest.param(Case(401, headers=dict), id="401-no-credential"),
    pytest.param(Case(401, headers=lambda: bearer("not-a-key")), id="401-unknown-key"),
    pytest.param(Case(401, headers=lambda: {"Authorization": "Basic dTpw"}), id="401-not-bearer"),
    pytest.param(Case(401, headers=lambda: {"Authorization": "Bearer"}), id="401-empty-bearer"),
    pytest.param(Case(401, headers=lambda: player(expires_in=-60)), id="401-expired-jwt"),
    pytest.param(
        Case(401, headers=lambda: player(secret="another-secret")), id="401-jwt-wrong-signature"
    ),
    pytest.param(Case(401, headers=lambda: player(algorithm="none")), id="401-jwt-alg-none"),
    pytest.param(Case(401, headers=lambda: bearer(player_token(None))), id="401-jwt-without-sub"),
    pytest.param(
        Case(401, headers=lambda: bearer(player_token(expires_in=None))), id="401-jwt-without-exp"
    ),
    pytest.param(Case(401, headers=lambda: player(algorithm="HS512")), id="401-jwt-hs512"),
    pytest.param(
        Case(401, headers=lambda: player(nbf=datetime.now(UTC) + timedelta(hours=1))),
        id="401-jwt-not-yet-valid",
    ),
    pytest.param(
        Case(401, headers=lambda: player("not a user id")), id="401-jwt-sub-not-a-user-id"
    ),
    pytest.param(Case(401, headers=lambda: bearer("not-a-key"), **lb()), id="401-read-unknown-key"),
    pytest.param(
        Case(401, headers=lambda: player(expires_in=-60), **read("/v1/boards/main/users/u-seed")),
        id="401-read-expired-jwt",
    ),
    pytest.param(
        Case(401, headers=dict, **read("/v1/boards/main/users/u-seed/events")),
        id="401-events-no-credential",
    ),
    # 403 credential not allowed
    pytest.param(Case(403, headers=lambda: player("u-1")), id="403-player-on-board-without-writes"),
    pytest.param(
        Case(
            403,
            path="/v1/boards/open/scores",
            body=lambda: score(user_id="u-2"),
            headers=lambda: player("u-1"),
            setup=open_board,
        ),
        id="403-player-for-another-user",
    ),
    pytest.param(
        Case(403, headers=lambda: player("u-1"), **read("/v1/boards/main/users/u-seed/events")),
        id="403-player-reads-another-users-events",
    ),
    # 404 unknown board, user or period
    pytest.param(Case(404, path="/v1/boards/nope/scores"), id="404-post-unknown-board"),
    pytest.param(Case(404, **read("/v1/boards/nope")), id="404-unknown-board"),
    pytest.param(Case(404, **read("/v1/boards/nope/leaderboard")), id="404-read-unknown-board"),
    pytest.param(
        Case(404, **read("/v1/boards/main/users/u-nobody", scope="region:eu")),
        id="404-standing-unknown-user",
    ),
    pytest.param(
        Case(404, **read("/v1/boards/main/users/u-seed", scope="region:na")),
        id="404-standing-user-not-in-region",
    ),
    pytest.param(
        Case(404, **lb(period="daily", period_id="2020-01-01")), id="404-period-past-retention"
    ),
    pytest.param(Case(404, **lb(period="weekly", period_id="2099-W01")), id="404-period-not-begun"),
    pytest.param(
        Case(404, setup=alltime_board, **read("/v1/boards/forever/leaderboard", period="daily")),
        id="404-period-the-board-does-not-keep",
    ),
    # 409 conflict
    pytest.param(
        Case(
            409,
            body=lambda: score(event_id="evt-1", value=6),
            setup=posting(score(event_id="evt-1", value=5)),
        ),
        id="409-event-id-with-another-body",
    ),
    pytest.param(
        Case(
            409,
            body=lambda: score(event_id="evt-1", occurred_at=ago(3600)),
            setup=posting(score(event_id="evt-1", occurred_at=ago(60))),
        ),
        id="409-late-retry-with-another-body",
    ),
    # 413 body too large
    pytest.param(Case(413, body=None, content=oversize, headers=lambda: SERVER | JSON), id="413"),
    pytest.param(
        Case(413, body=None, content=streamed_oversize, headers=lambda: SERVER | JSON),
        id="413-streamed-without-length",
    ),
    # 422 validation
    pytest.param(Case(422, body=lambda: score(user_id=DROP), loc="user_id"), id="422-no-user_id"),
    pytest.param(
        Case(422, body=lambda: score(user_id="-starts-with-dash"), loc="user_id"),
        id="422-bad-user_id",
    ),
    pytest.param(
        Case(422, body=lambda: score(user_id="u" * 65), loc="user_id"), id="422-long-user_id"
    ),
    pytest.param(Case(422, body=lambda: score(region="EU"), loc="region"), id="422-bad-region"),
    pytest.param(Case(422, body=lambda: score(value=5.0), loc="value"), id="422-float-value"),
    pytest.param(Case(422, body=lambda: score(value=True), loc="value"), id="422-boolean-value"),
    pytest.param(Case(422, body=lambda: score(value="5"), loc="value"), id="422-string-value"),
    pytest.param(
        Case(422, body=lambda: score(value=1_000_001), loc="value"), id="422-value-over-max"
    ),
    pytest.param(
        Case(422, body=lambda: score(value=-1_000_001), loc="value"), id="422-value-under-min"
    ),
    pytest.param(
        Case(422, body=lambda: score(value=10**40), loc="value"),
        id="422-value-huge-integer",
    ),
    pytest.param(
        Case(
            422,
            body=NEAR_ALLTIME_MAX.body,
            setup=NEAR_ALLTIME_MAX.setup,
            settings={"user_rate": 1000.0},
            loc="value",
        ),
        id="422-score-beyond-encodable-range",
    ),
    pytest.param(
        Case(422, body=lambda: score(occurred_at=ago(11 * 60)), loc="occurred_at"),
        id="422-occurred_at-too-old",
    ),
    pytest.param(
        Case(422, body=lambda: score(occurred_at=ago(-60)), loc="occurred_at"),
        id="422-occurred_at-in-future",
    ),
    pytest.param(
        Case(
            422,
            body=lambda: score(occurred_at=datetime.now(UTC).replace(tzinfo=None).isoformat()),
            loc="occurred_at",
        ),
        id="422-occurred_at-without-offset",
    ),
    pytest.param(
        Case(422, body=lambda: score(occurred_at="yesterday"), loc="occurred_at"),
        id="422-occurred_at-not-a-time",
    ),
    pytest.param(Case(422, body=lambda: score(colour="red"), loc="colour"), id="422-extra-field"),
    pytest.param(
        Case(422, body=lambda: score(display_name="An\x07a"), loc="display_name"),
        id="422-display_name-control-character",
    ),
    pytest.param(
        Case(422, body=lambda: score(display_name="An\x85a"), loc="display_name"),
        id="422-display_name-c1-control-character",
    ),
    pytest.param(
        Case(422, body=lambda: score(display_name="x" * 65), loc="display_name"),
        id="422-display_name-too-long",
    ),
    pytest.param(
        Case(422, body=lambda: score(display_name=""), loc="display_name"),
        id="422-display_name-empty",
    ),
    pytest.param(
        Case(422, body=lambda: score(team_id="Red Wombats"), loc="team_id"), id="422-bad-team_id"
    ),
    pytest.param(
        Case(422, body=lambda: score(event_id="has space"), loc="event_id"), id="422-bad-event_id"
    ),
    pytest.param(
        Case(
            422,
            body=lambda: score(event_id="evt-a"),
            headers=lambda: SERVER | {"Idempotency-Key": "evt-b"},
            loc="event_id",
        ),
        id="422-idempotency-key-differs-from-event_id",
    ),
    pytest.param(
        Case(
            422,
            headers=lambda: SERVER | {"Idempotency-Key": "no spaces allowed"},
            loc="Idempotency-Key",
        ),
        id="422-bad-idempotency-key",
    ),
    pytest.param(Case(422, body=lambda: [score()]), id="422-body-not-an-object"),
    pytest.param(Case(422, **raw(b"")), id="422-empty-body"),
    pytest.param(Case(422, **lb(scope="planet"), loc="scope"), id="422-bad-scope"),
    pytest.param(Case(422, **lb(scope="region:EU"), loc="scope"), id="422-bad-region-scope"),
    pytest.param(Case(422, **lb(period="hourly"), loc="period"), id="422-bad-period"),
    pytest.param(
        Case(422, **lb(period="daily", period_id="2026-13-45"), loc="period_id"),
        id="422-bad-period_id",
    ),
    pytest.param(
        # Last week: kept, whenever this runs.
        Case(422, **lb(period="weekly", period_id=LAST_WEEK + "\n"), loc="period_id"),
        id="422-period_id-trailing-newline",
    ),
    pytest.param(Case(422, **lb(limit=0), loc="limit"), id="422-limit-0"),
    pytest.param(Case(422, **lb(limit=1001), loc="limit"), id="422-limit-1001"),
    pytest.param(Case(422, **lb(cursor="not-a-cursor!"), loc="cursor"), id="422-bad-cursor"),
    pytest.param(
        Case(422, **lb(cursor=nan_cursor()), loc="cursor"),
        id="422-nan-cursor",
    ),
    pytest.param(
        Case(422, **read("/v1/boards/main/users/u-seed", scope="region:eu", around=51)),
        id="422-standing-around-51",
    ),
    pytest.param(
        Case(422, **read("/v1/boards/main/users/u-seed/events", cursor="bogus"), loc="cursor"),
        id="422-events-bad-cursor",
    ),
    # 429 rate limited
    pytest.param(
        Case(
            429,
            settings={"user_rate": 1.0},
            setup=posting(score(event_id="r-1"), score(event_id="r-2")),
            body=lambda: score(event_id="r-3"),
        ),
        id="429-user-rate",
    ),
    pytest.param(
        Case(429, settings={"key_rate": 1.0}, body=lambda: score(user_id="u-2")),
        id="429-key-rate",
    ),
    # 503 a dependency is down: the broker, with the outbox full
    pytest.param(
        Case(
            503,
            settings={"outbox_max": 2},
            setup=posting(score(user_id="u-2")),
            body=lambda: score(user_id="u-3"),
        ),
        id="503-outbox-full",
    ),
]


# One problem type per status, whether Ladder or the framework under it refused the request.
PROBLEM_TYPES = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    409: "conflict",
    413: "too-large",
    422: "validation",
    429: "rate-limited",
    503: "unavailable",
}


async def test_error_cases_cover_every_status_of_the_contract() -> None:
    statuses = {case.status for p in ERROR_CASES for case in p.values if isinstance(case, Case)}
    assert statuses == {400, 401, 403, 404, 409, 413, 422, 429, 503}


@pytest.mark.parametrize("case", ERROR_CASES)
async def test_an_error_is_a_problem_and_changes_nothing(
    case: Case,
    quiet: LadderSettings,
    redis: Redis,
    keys: Keys,
    mysql_database: str,
) -> None:
    settings = quiet.model_copy(update=case.settings)
    async with api_client(settings) as client:
        # Something on the board, so that "nothing changed" compares real state.
        await post(client, score(event_id="seed-1", user_id="u-seed", display_name="Seed"))
        if case.setup is not None:
            await case.setup(client, redis, keys)
        before = await snapshot(redis, settings.key_prefix)
        response = await client.request(
            case.method,
            case.path,
            params=case.params,
            json=case.body() if case.body is not None else None,
            content=case.content() if case.content is not None else None,
            headers=case.headers(),
        )
        after = await snapshot(redis, settings.key_prefix)

    body = assert_problem(response, case.status)
    assert body["type"] == f"https://ladder.dev/problems/{PROBLEM_TYPES[case.status]}", body
    if case.loc is not None:
        assert any(e["loc"] and e["loc"][-1] == case.loc for e in body["errors"]), body
    assert before, "the seed score should be in the snapshot"
    assert after == before


# --- 2. idempotency ----------------------------------------------------------------------------


async def test_a_repeated_event_answers_the_first_result_and_counts_once(
    quiet: LadderSettings, redis: Redis
) -> None:
    async with api_client(quiet) as client:
        first = await post(client, score(event_id="evt-1", value=5))
        # Someone overtakes u-1 in between: the repeat still answers the first result.
        await post(client, score(user_id="u-2", value=50))
        again = await post(client, score(event_id="evt-1", value=5))
        board = await get_ok(client, LEADERBOARD, scope="region:eu")
        standing = await get_ok(client, "/v1/boards/main/users/u-1", scope="region:eu")

    assert first["duplicate"] is False
    assert again["duplicate"] is True
    assert again["event_id"] == "evt-1"
    assert again["periods"] == first["periods"]
    assert {k: v for k, v in again.items() if k != "duplicate"} == {
        k: v for k, v in first.items() if k != "duplicate"
    }
    assert [(e["user_id"], e["score"]) for e in board["entries"]] == [("u-2", 50), ("u-1", 5)]
    assert standing["score"] == 5
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 2


async def test_the_idempotency_key_header_is_the_event_id(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        first = await post(client, score(value=7), headers=SERVER | {"Idempotency-Key": "key-1"})
        by_header = await post(
            client, score(value=7), headers=SERVER | {"Idempotency-Key": "key-1"}
        )
        by_body = await post(client, score(event_id="key-1", value=7))
        both = await post(
            client, score(event_id="key-1", value=7), headers=SERVER | {"Idempotency-Key": "key-1"}
        )
        conflict = await client.post(
            SCORES, json=score(value=8), headers=SERVER | {"Idempotency-Key": "key-1"}
        )
        standing = await get_ok(client, "/v1/boards/main/users/u-1", scope="region:eu")

    assert first["event_id"] == "key-1" and first["duplicate"] is False
    for repeat in (by_header, by_body, both):
        assert repeat["duplicate"] is True
        assert repeat["periods"] == first["periods"]
    assert_problem(conflict, 409)
    assert standing["score"] == 7


async def test_without_an_event_id_the_server_makes_one(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        one = await post(client, score(value=2))
        two = await post(client, score(value=3))
        standing = await get_ok(client, "/v1/boards/main/users/u-1", scope="region:eu")

    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", one["event_id"])
    assert one["event_id"] != two["event_id"]
    assert not one["duplicate"] and not two["duplicate"]
    assert standing["score"] == 5


async def test_a_retry_after_the_lateness_window_is_still_a_duplicate(
    quiet: LadderSettings,
) -> None:
    settings = quiet.model_copy(update={"allowed_lateness": 1.0})
    async with api_client(settings) as client:
        occurred = datetime.now(UTC) - timedelta(seconds=0.5)
        body = score(event_id="late-1", occurred_at=rfc(occurred))
        first = await post(client, body)
        # Only the clock can take the event past the allowance: wait out what is left of it.
        left = occurred + timedelta(seconds=1.05) - datetime.now(UTC)
        await asyncio.sleep(max(left.total_seconds(), 0))
        fresh = await client.post(
            SCORES, json=score(event_id="late-2", occurred_at=rfc(occurred)), headers=SERVER
        )
        retry = await post(client, body)

    assert_problem(fresh, 422)
    assert retry["duplicate"] is True
    assert retry["periods"] == first["periods"]


# --- 3. the answer to a score ------------------------------------------------------------------


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
    await add_board(redis, keys, Board(board_id="open", player_writes=True))
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


# --- 4. reads ----------------------------------------------------------------------------------


async def seed_players(client: httpx.AsyncClient, count: int = 25) -> None:
    """Users u-01 .. u-<count> in eu, user i scoring 10 * i: u-<count> ranks first."""
    for i in range(1, count + 1):
        await post(client, score(user_id=f"u-{i:02d}", value=10 * i, display_name=f"Player {i}"))


async def read_all_pages(
    client: httpx.AsyncClient, limit: int, **params: Any
) -> list[dict[str, Any]]:
    pages = []
    cursor = None
    while True:
        query = params | {"limit": limit} | ({"cursor": cursor} if cursor else {})
        page = await get_ok(client, LEADERBOARD, **query)
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "the cursor does not end"


async def test_a_region_pages_with_a_cursor(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        await seed_players(client)
        pages = await read_all_pages(client, 10, scope="region:eu")

    assert [len(p["entries"]) for p in pages] == [10, 10, 5]
    entries = [e for p in pages for e in p["entries"]]
    assert [e["rank"] for e in entries] == list(range(1, 26))
    assert [e["user_id"] for e in entries] == [f"u-{i:02d}" for i in range(25, 0, -1)]
    assert [e["score"] for e in entries] == [10 * i for i in range(25, 0, -1)]
    assert [e["display_name"] for e in entries] == [f"Player {i}" for i in range(25, 0, -1)]
    for page in pages:
        assert page["board_id"] == "main"
        assert page["scope"] == "region:eu"
        assert (page["period"], page["period_id"]) == ("alltime", "all")
        assert page["total"] == 25
        assert page["as_of"] is not None
    assert all(p["next_cursor"] for p in pages[:-1])
    assert pages[-1]["next_cursor"] is None


@pytest.mark.parametrize("limit", [10, 3, 1])
async def test_pages_over_exact_ties_repeat_and_skip_no_one(
    quiet: LadderSettings, limit: int
) -> None:
    at = datetime.now(UTC) - timedelta(seconds=30)
    async with api_client(quiet) as client:
        for i in range(25):
            await post(client, score(user_id=f"u-{i:02d}", value=100, occurred_at=rfc(at)))
        pages = await read_all_pages(
            client, limit, scope="region:eu", period="daily", period_id=period_ids(at)["daily"]
        )

    entries = [e for p in pages for e in p["entries"]]
    assert [len(p["entries"]) for p in pages][:-1] == [limit] * (len(pages) - 1)
    assert [e["rank"] for e in entries] == list(range(1, 26))
    assert sorted(e["user_id"] for e in entries) == [f"u-{i:02d}" for i in range(25)]
    assert {e["score"] for e in entries} == {100}


async def test_a_standing_shows_its_neighbours_and_percentile(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        await seed_players(client)
        middle = await get_ok(client, "/v1/boards/main/users/u-13", scope="region:eu", around=2)
        top = await get_ok(client, "/v1/boards/main/users/u-25", scope="region:eu", around=2)
        bottom = await get_ok(client, "/v1/boards/main/users/u-01", scope="region:eu", around=2)
        alone = await get_ok(client, "/v1/boards/main/users/u-13", scope="region:eu")

    assert {k: middle[k] for k in ("user_id", "rank", "score", "total")} == {
        "user_id": "u-13",
        "rank": 13,
        "score": 130,
        "total": 25,
    }
    # The share of the board ranked at or below the user: 13 of 25.
    assert middle["percentile"] == pytest.approx(52.0)
    assert middle["around"] == [
        {
            "rank": rank,
            "user_id": f"u-{26 - rank:02d}",
            "score": 10 * (26 - rank),
            "display_name": f"Player {26 - rank}",
        }
        for rank in range(11, 16)
    ]
    assert [e["rank"] for e in top["around"]] == [1, 2, 3]
    assert top["percentile"] == pytest.approx(100.0)
    assert [e["rank"] for e in bottom["around"]] == [23, 24, 25]
    assert bottom["percentile"] == pytest.approx(4.0)
    assert [e["user_id"] for e in alone["around"]] == ["u-13"]


async def test_boards_are_listed_with_every_field(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        listed = await get_ok(client, "/v1/boards")
        one = await get_ok(client, "/v1/boards/main")
        anonymous = await client.get("/v1/boards/main")

    assert listed == {"boards": [MAIN]}
    assert one == MAIN
    assert anonymous.status_code == 200


async def test_the_global_scope_is_empty_until_the_aggregator_merges(
    quiet: LadderSettings,
) -> None:
    async with api_client(quiet) as client:
        await post(client, score(value=10))
        default = await client.get(LEADERBOARD)
        before = datetime.now(UTC)
        weekly = await client.get(LEADERBOARD, params={"scope": "global", "period": "weekly"})
        weeks = {period_ids(before)["weekly"], period_ids(datetime.now(UTC))["weekly"]}

    assert default.status_code == 200
    assert default.json() == {
        "board_id": "main",
        "scope": "global",
        "period": "alltime",
        "period_id": "all",
        "total": 0,
        "as_of": None,
        "entries": [],
        "next_cursor": None,
    }
    assert weekly.status_code == 200
    assert weekly.json()["period_id"] in weeks
    assert (weekly.json()["as_of"], weekly.json()["entries"]) == (None, [])


async def test_a_past_period_within_retention_is_readable(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
        response = await client.get(
            LEADERBOARD, params={"scope": "region:eu", "period": "daily", "period_id": yesterday}
        )

    assert response.status_code == 200, response.text
    assert (response.json()["period_id"], response.json()["entries"]) == (yesterday, [])


# --- 5. public reads ---------------------------------------------------------------------------


async def test_without_public_reads_a_read_needs_a_credential(quiet: LadderSettings) -> None:
    settings = quiet.model_copy(update={"public_reads": False})
    async with api_client(settings) as client:
        await post(client, score(value=10))
        anonymous = [
            await client.get(LEADERBOARD, params={"scope": "region:eu"}),
            await client.get("/v1/boards"),
            await client.get("/v1/boards/main/users/u-1", params={"scope": "region:eu"}),
        ]
        as_player = await client.get(
            LEADERBOARD, params={"scope": "region:eu"}, headers=player("u-9")
        )
        as_server = await client.get(LEADERBOARD, params={"scope": "region:eu"}, headers=SERVER)

    for response in anonymous:
        assert_problem(response, 401)
    assert as_player.status_code == 200
    assert [e["user_id"] for e in as_player.json()["entries"]] == ["u-1"]
    assert as_server.status_code == 200


# --- 6. the events read ------------------------------------------------------------------------


def accepted(event_id: str, user_id: str, value: int, at: datetime) -> ScoreAccepted:
    return ScoreAccepted.model_validate(
        {
            "event_id": event_id,
            "board_id": "main",
            "user_id": user_id,
            "region": "eu",
            "team_id": "red-wombats",
            "display_name": None,
            "value": value,
            "occurred_at": at - timedelta(seconds=1),
            "accepted_at": at,
            "periods": {
                "alltime": {
                    "period_id": "all",
                    "score": value,
                    "rank": 1,
                    "previous_rank": None,
                    "improved": True,
                }
            },
        }
    )


async def test_a_users_events_come_from_the_history_database(
    quiet: LadderSettings, redis: Redis, mysql_database: str
) -> None:
    t0 = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)
    async with api_client(quiet) as client:
        empty = await get_ok(client, "/v1/boards/main/users/u-1/events")
        async with open_engine(quiet.mysql_url) as engine:
            await HistoryHandler(engine)(
                [
                    accepted("e-1", "u-1", 3, t0),
                    accepted("e-2", "u-2", 4, t0 + timedelta(seconds=1)),
                    accepted("e-3", "u-1", 5, t0 + timedelta(seconds=2)),
                    accepted("e-4", "u-1", -6, t0 + timedelta(seconds=3)),
                ]
            )
        first = await get_ok(client, "/v1/boards/main/users/u-1/events", limit=2)
        second = await get_ok(
            client, "/v1/boards/main/users/u-1/events", limit=2, cursor=first["next_cursor"]
        )
        own = await client.get("/v1/boards/main/users/u-1/events", headers=player("u-1"))
        other = await client.get("/v1/boards/main/users/u-2/events", headers=player("u-1"))

    assert empty == {"events": [], "next_cursor": None}
    assert first["events"][0] == {
        "event_id": "e-4",
        "user_id": "u-1",
        "region": "eu",
        "team_id": "red-wombats",
        "value": -6,
        "occurred_at": "2026-11-29T17:00:02.000Z",
        "accepted_at": "2026-11-29T17:00:03.000Z",
    }
    assert [e["event_id"] for e in first["events"]] == ["e-4", "e-3"]
    assert [e["event_id"] for e in second["events"]] == ["e-1"]
    assert second["next_cursor"] is None
    assert own.status_code == 200
    assert [e["event_id"] for e in own.json()["events"]] == ["e-4", "e-3", "e-1"]
    assert_problem(other, 403)


# --- 7. operations -----------------------------------------------------------------------------


def scores_counted(metrics: str, outcome: str) -> float:
    match = re.search(
        rf'^ladder_api_scores_total\{{outcome="{outcome}"\}} (\S+)$', metrics, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


async def test_health_readiness_metrics_and_openapi(
    settings: LadderSettings, redis: Redis, broker: Topology, mysql_database: str
) -> None:
    settings = settings.model_copy(update={"shutdown_grace_seconds": 2.0})
    outbox = Keys(settings.key_prefix).outbox("main")
    async with api_client(settings) as client:
        health = await client.get("/healthz")

        async def broker_up() -> dict[str, Any] | None:
            response = await client.get("/readyz")
            body: dict[str, Any] = response.json()
            return body if body["dependencies"]["broker"] == "up" else None

        ready = await eventually(broker_up)
        before = (await client.get("/metrics")).text
        await post(client, score(event_id="m-1"))
        await post(client, score(event_id="m-1"))
        metrics = await client.get("/metrics")
        openapi = await client.get("/openapi.json")
        # With the broker up, the relay empties the outbox.
        await eventually(lambda: _is_zero(redis.xlen(outbox)))

    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    assert ready["status"] == "ready"
    assert {"redis", "broker", "mysql"} <= ready["dependencies"].keys()
    assert ready["dependencies"]["redis"] == "up"
    assert ready["dependencies"]["mysql"] == "up"
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "ladder_api_scores_total" in metrics.text
    assert scores_counted(metrics.text, "accepted") == scores_counted(before, "accepted") + 1
    assert scores_counted(metrics.text, "duplicate") == scores_counted(before, "duplicate") + 1
    paths = openapi.json()["paths"]
    assert "post" in paths["/v1/boards/{board_id}/scores"]
    assert "get" in paths["/v1/boards/{board_id}/leaderboard"]


async def _is_zero(count: Awaitable[int]) -> bool:
    return await count == 0


async def test_with_the_broker_down_the_api_is_ready_and_accepts_scores(
    quiet: LadderSettings, redis: Redis, mysql_database: str
) -> None:
    async with api_client(quiet) as client:
        ready = await client.get("/readyz")
        response = await client.post(SCORES, json=score(), headers=SERVER)

    assert ready.status_code == 200
    assert ready.json()["dependencies"]["broker"] == "down"
    assert ready.json()["dependencies"]["redis"] == "up"
    assert response.status_code == 200
    assert await redis.xlen(Keys(quiet.key_prefix).outbox("main")) == 1


async def test_shutdown_closes_the_hubs_redis_connection(
    settings: LadderSettings,
    redis: Redis,
    broker: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = settings.model_copy(update={"shutdown_grace_seconds": 2.0})
    real_aclose = Redis.aclose

    async def slow_aclose(self: Redis, *args: Any, **kwargs: Any) -> None:
        # Widens the window that shutdown has to cut a close short; a close that is let
        # finish is only slower.
        await asyncio.sleep(0.5)
        await real_aclose(self, *args, **kwargs)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with api_client(settings) as client:
            # The relay connected: at shutdown it takes longer to stop than the idle hub.
            await eventually(lambda: _broker_is_up(client))
            monkeypatch.setattr(Redis, "aclose", slow_aclose)
        monkeypatch.undo()
        gc.collect()

    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == []


async def _broker_is_up(client: httpx.AsyncClient) -> bool:
    response = await client.get("/readyz")
    return bool(response.json()["dependencies"]["broker"] == "up")
