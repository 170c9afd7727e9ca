"""Every error is problem+json and changes nothing (docs/api.md section 1; the
credentials of section 2 and the limits of section 9a among them): the API
in-process against real Redis, one case per way a request can be refused.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jwt
import orjson
import pytest
from redis.asyncio import Redis

from shared.boards import Board
from shared.keys import Keys
from shared.ranking import MAX_SCORE
from shared.settings import DEV_JWT_SECRET, LadderSettings
from tests.api.helpers import (
    DROP,
    JSON,
    LEADERBOARD,
    SCORES,
    MiB,
    add_board,
    ago,
    assert_problem,
    period_ids,
    post,
    score,
)
from tests.helpers import ADMIN, SERVER, api_client, bearer, player, player_token, snapshot

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


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
    await add_board(redis, keys, Board(board_id="open", player_writes=True, regions=("eu",)))


async def alltime_board(_: httpx.AsyncClient, redis: Redis, keys: Keys) -> None:
    await add_board(redis, keys, Board(board_id="forever", periods=("alltime",)))


def posting(*bodies: dict[str, Any]) -> Setup:
    async def setup(client: httpx.AsyncClient, _: Redis, __: Keys) -> None:
        for body in bodies:
            await post(client, body)

    return setup


class NearAlltimeMax:
    """Setup and body of a write that would take an ``incr`` total past ±(2**53 - 1), the range
    of exact scores of every period."""

    def __init__(self) -> None:
        self.at = ""

    def body(self) -> dict[str, Any]:
        return score(user_id="u-big", value=1, occurred_at=self.at)

    async def setup(self, client: httpx.AsyncClient, redis: Redis, keys: Keys) -> None:
        # A board whose values may be anything exact; at 2**53 - 1, one more leaves the range.
        wide = Board(board_id="wide", min_value=-MAX_SCORE, max_value=MAX_SCORE)
        await add_board(redis, keys, wide)
        self.at = ago(5)
        first = score(user_id="u-big", value=MAX_SCORE, occurred_at=self.at)
        await post(client, first, board="wide")


NEAR_ALLTIME_MAX = NearAlltimeMax()
WIDE_SCORES = "/v1/boards/wide/scores"


def nan_cursor() -> str:
    raw_cursor = orjson.dumps({"s": "nan", "m": "000000000000u-seed"})
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
        Case(401, headers=lambda: player(iat=datetime.now(UTC) + timedelta(hours=1))),
        id="401-jwt-issued-ahead",
    ),
    pytest.param(Case(401, headers=lambda: player(aud="another-service")), id="401-jwt-audience"),
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
            path=WIDE_SCORES,
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
    pytest.param(
        Case(422, body=lambda: score(occurred_at=int(time.time())), loc="occurred_at"),
        id="422-occurred_at-unix-seconds",
    ),
    pytest.param(
        Case(422, body=lambda: score(occurred_at=str(int(time.time()))), loc="occurred_at"),
        id="422-occurred_at-unix-seconds-as-text",
    ),
    pytest.param(
        Case(422, body=lambda: score(occurred_at=datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))),
        id="422-occurred_at-iso-basic-format",
    ),
    pytest.param(
        Case(422, **read("/v1/boards/main/snapshots", at=str(int(time.time())))),
        id="422-snapshot-at-unix-seconds",
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
        Case(422, body=lambda: score(display_name="   "), loc="display_name"),
        id="422-display_name-spaces-only",
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


async def test_a_time_whose_plus_arrived_as_a_space_is_told_so(
    quiet: LadderSettings, mysql_database: str
) -> None:
    """A query string's '+' decodes to a space, so an offset sent unencoded arrives as
    ``00:00:00 01:00``: the 422 says so, where it said the time had no offset."""
    async with api_client(quiet) as client:
        raw = "/v1/boards/main/snapshots?at=2026-11-29T18:00:00+01:00"
        response = await client.get(raw, headers=SERVER)
        encoded = await client.get(
            "/v1/boards/main/snapshots", params={"at": "2026-11-29T18:00:00+01:00"}, headers=SERVER
        )
    body = assert_problem(response, 422)
    assert body["errors"][0]["loc"] == ["query", "at"]
    assert "arrived as a space" in body["errors"][0]["msg"]
    assert "%2B" in body["errors"][0]["msg"]
    assert encoded.status_code == 404, encoded.text  # read as meant: no snapshot by then


async def test_every_operation_declares_the_413_any_route_answers(quiet: LadderSettings) -> None:
    """The body limit answers 413 on any route to a request that says its body is larger than
    1 MiB, a read included; the document declared it on the routes that take a body alone."""
    async with api_client(quiet) as client:
        refused = await client.get("/v1/boards", headers={"Content-Length": "2000000"})
        document = (await client.get("/openapi.json")).json()
    assert_problem(refused, 413)
    undeclared = [
        f"{method.upper()} {path}"
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if "413" not in operation["responses"]
    ]
    assert undeclared == []


async def test_every_operation_that_refuses_an_unknown_query_parameter_declares_the_422(
    quiet: LadderSettings,
) -> None:
    """A query parameter a route does not take is a 422 on every route of the API and on the
    ops routes; the document left the 422 out where the route had no parameter of its own."""
    async with api_client(quiet) as client:
        document = (await client.get("/openapi.json")).json()
        undeclared = []
        for path, operations in document["paths"].items():
            if "get" not in operations or "422" in operations["get"]["responses"]:
                continue
            concrete = re.sub(r"\{[^}]+\}", "x", path)
            answer = await client.get(concrete, params={"zz": "1"}, headers=ADMIN)
            if answer.status_code == 422:
                undeclared.append(path)
    assert undeclared == []


@pytest.mark.parametrize(
    ("claims", "said"),
    [
        ({"nbf": 3600}, "not valid yet: its nbf or iat is more than 5 s ahead"),
        ({"iat": 3600}, "not valid yet: its nbf or iat is more than 5 s ahead"),
        ({"aud": "another-service"}, "names an audience (aud)"),
        ({"exp": None}, "has no exp claim"),
        ({"exp": "4102444800"}, "exp is not a number"),
        ({"exp": "soon"}, "exp is not a number"),
        ({"exp": [4102444800]}, "exp is not a number"),
        ({"exp": True}, "exp is not a number"),
        ({"sub": 42}, "subject is not a user id"),
        ({"sub": "u 1"}, "subject is not a user id"),
    ],
    ids=[
        "nbf-ahead",
        "iat-ahead",
        "audience",
        "no-exp",
        "exp-digits",
        "exp-words",
        "exp-a-list",
        "exp-true",
        "sub-a-number",
        "sub-not-an-id",
    ],
)
async def test_a_refused_player_token_is_told_what_is_wrong(
    quiet: LadderSettings, claims: dict[str, Any], said: str
) -> None:
    """An issuer whose clock runs ahead, or that names an audience, learns which from the 401
    (it read "not a valid key or player token" for all); a string ``exp``, which PyJWT reads as
    a number, is refused as RFC 7519's NumericDate is a number, and so is ``true`` (which it
    read as 1: "expired"); a subject that is no string is said as one that is no user id."""
    now = int(time.time())
    payload = {"sub": "u-1", "exp": now + 3600}
    for claim, value in claims.items():
        if value is None:
            del payload[claim]
        else:
            payload[claim] = now + value if claim in ("nbf", "iat") else value
    token = jwt.encode(payload, DEV_JWT_SECRET, algorithm="HS256")
    async with api_client(quiet) as client:
        answer = await client.get("/v1/boards/main/users/u-1/events", headers=bearer(token))
    assert said in assert_problem(answer, 401)["detail"]


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/readyz", "GET, HEAD"),
        ("/healthz", "GET, HEAD"),
        ("/metrics", "GET, HEAD"),
        ("/v1/boards/main/leaderboard", "GET"),
    ],
)
async def test_a_405_allows_head_where_the_path_answers_it(
    quiet: LadderSettings, path: str, allow: str
) -> None:
    """The ops routes answer HEAD, which no operation of the document lists: the 405's Allow
    named GET alone there; a read without a HEAD route still names GET alone."""
    async with api_client(quiet) as client:
        refused = await client.post(path, headers=SERVER)
        head = await client.head(path, headers=SERVER)
    assert_problem(refused, 405)
    assert refused.headers["allow"] == allow
    assert (head.status_code == 405) is ("HEAD" not in allow)


@pytest.mark.parametrize(
    ("at", "said"),
    [
        ("2026-12-07T08:27:60Z", "a leap second (:60) is not taken"),
        ("2026-12-07T08:27:30+24:00", "an offset's hours are 00 to 23"),
        ("2026-12-07T24:00:00Z", "hour must be in 0..23"),
        ("2026-02-30T00:00:00Z", "day is out of range for month"),
    ],
    ids=["leap-second", "offset-24h", "hour-24", "february-30"],
)
async def test_a_time_of_rfc_3339_s_form_that_names_no_time_says_which_part(
    quiet: LadderSettings, at: str, said: str
) -> None:
    """Such a time read "unexpected extra characters at the end of the input", pydantic's
    words for another fault, in a score's occurred_at and in a snapshot's at alike."""
    async with api_client(quiet) as client:
        posted = await client.post(SCORES, json=score(occurred_at=at), headers=SERVER)
        asked = await client.get("/v1/boards/main/snapshots", params={"at": at}, headers=SERVER)
    for answer in (posted, asked):
        error = assert_problem(answer, 422)["errors"][0]
        assert error["loc"][-1] in ("occurred_at", "at")
        assert said in error["msg"], error


async def test_a_time_too_far_ahead_names_the_tolerance(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        answer = await client.post(SCORES, json=score(occurred_at=ago(-60)), headers=SERVER)
    assert "future tolerance of 5 seconds" in assert_problem(answer, 422)["detail"]
