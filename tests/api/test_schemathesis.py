"""Schemathesis against the API's own OpenAPI document (docs/api.md sections 1 and 10).

The real app runs in-process (over ASGI, lifespan and all) on the test's own Redis prefix, broker
prefix and MySQL database, one app per operation. Requests carry the admin key, which may do
everything, so that operations get past authentication to their real work; where the document
says a credential is required, Schemathesis sends a request that succeeded again without the
key and with a wrong one, and a last test sends every operation without one. Two boards, scores
(merged into the global view as the aggregator would), friends, history events and snapshots
are seeded first, and the generated ids and scopes name them as often as not, so that reads
find something to read.

Every check Schemathesis has (``--checks all``): no server error; a documented status, content
type, headers and body; every schema-valid request accepted and every schema-violating one
refused; a missing credential refused where one is required; 405 for an undocumented method,
with an ``Allow`` that lists exactly the documented ones. Over the schema's examples, the
coverage phase's boundary cases and random ones, then the stateful phase: sequences of calls
that follow the links Schemathesis infers between operations (a board's id from one answer into
the next request). What the document cannot say is listed in :data:`REFUSALS`, each with its
reason; any other finding fails the test.

Bounded for CI: a fixed budget of examples per operation and of stateful runs, and a
deterministic seed, so that two runs send the same requests. ``-m "not fuzz"`` skips it.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import aiormq
import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.python import asgi

from services.aggregator.merge import Merger
from services.api.app import create_app
from services.history.handlers import HistoryHandler
from shared.amqp import connect as connect_broker
from shared.boards import MAIN_BOARD, Board
from shared.db import open_engine
from shared.db_boards import SnapshotRow, save_snapshots
from shared.events import ScoreAccepted, ScoreMessage, message_body, with_outbox_id
from shared.keys import Keys, dirty_member
from shared.periods import CALENDAR_PERIODS, window_at
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import ADMIN, derive

pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
]

# Examples per operation in the fuzzing phase, after the schema's examples and the coverage
# phase's boundary cases; then the stateful runs and the calls in each.
MAX_EXAMPLES = 260
STATEFUL_RUNS = 40
STATEFUL_STEPS = 6
# Both phases: the same requests on every run, and no verdict on the runner's speed.
REPEATABLE = hypothesis.settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[
        # One app serves every example of an operation, as a server would.
        hypothesis.HealthCheck.function_scoped_fixture,
        # Generating from patterns is slow on a slow runner; that is no fault of the API.
        hypothesis.HealthCheck.too_slow,
    ],
)

RACES = Board(
    board_id="races",
    operator="best",
    order="asc",
    periods=("daily", "alltime"),
    player_writes=True,
    regions=("eu", "na"),
    badges={"podium": 10},
)
BOARDS = (MAIN_BOARD, RACES)
# user, region, team: u-42 is the user of the document's examples.
PLAYERS = (("u-42", "eu", "red"), ("u-1", "eu", "blue"), ("u-2", "na", "red"))
SCOPES = ("global", "region:eu", "region:na", "teams", "friends:u-42")
# The current periods, and periods at the edges of the calendar.
PERIOD_IDS = (
    *(window_at(period, datetime.now(UTC), "UTC").period_id for period in CALENDAR_PERIODS),
    *("0001-01-01", "0001-W01", "0001-01", "9999-12-31", "9999-W52", "9999-12"),
)

# The document as the app serves it at /openapi.json; building the app connects to nothing.
DOCUMENT = create_app(LadderSettings(_env_file=None, env="dev")).openapi()  # type: ignore[call-arg]
schema = schemathesis.openapi.from_dict(DOCUMENT)
# The admin key on every request, as the command line's -H would send it: a configured header,
# which Schemathesis neither mutates nor leaves out, and takes away only in its own probes.
schema.config.update(headers=ADMIN)
# A body over the limit is refused with a 413 before anything reads it, a refusal like a 422.
_rejection = schema.config.checks.negative_data_rejection
schema.config.checks.negative_data_rejection = type(_rejection).from_dict(
    {"expected-statuses": [*_rejection.expected_statuses, 413]}
)

# --- what the document cannot say ---------------------------------------------------------------

LEADERBOARD = "GET /v1/boards/{board_id}/leaderboard"
MVPS = "GET /v1/boards/{board_id}/mvps"
SNAPSHOTS = "GET /v1/boards/{board_id}/snapshots"
RANKS = "GET /v1/boards/{board_id}/users/{user_id}/ranks"
SCORE = "POST /v1/boards/{board_id}/scores"
BATCH = "POST /v1/boards/{board_id}/scores/batch"
PUT_BOARD = "PUT /v1/boards/{board_id}"
BEFRIEND = "PUT /v1/users/{user_id}/friends/{friend_id}"

# Schema-valid requests that the server refuses, with a 422 that points at one of these places,
# for a reason no JSON Schema of a single parameter or body can state: it depends on another
# parameter, on the board's definition, on the server's clock or on what the server handed out.
# Keyed by the operation ("*": any that has the parameter) and where the 422 points.
REFUSALS: dict[tuple[str, tuple[str, ...]], str] = {
    ("*", ("query", "period_id")): (
        "A period id names a real day, ISO week, month or firing of the board's schedule "
        "(2026-02-30 and 2025-W53 fit the pattern) of the kind that `period` gives: the "
        "calendar, the board's definition, and a tie to another parameter"
    ),
    ("*", ("query", "cursor")): "A cursor is opaque: only one that the server handed out is read",
    (LEADERBOARD, ("query", "scope")): (
        "The teams scope exists only on incr boards: it depends on the board's definition"
    ),
    (SNAPSHOTS, ("query", "scope")): (
        "The teams scope exists only on incr boards: it depends on the board's definition"
    ),
    (MVPS, ("path", "board_id")): "MVPs exist only on incr boards (the board's definition)",
    (RANKS, ("query", "period_id")): (
        "Each period id names a real day, ISO week or month, and at most one of each kind is "
        "given: the calendar, and items tied together"
    ),
    (SNAPSHOTS, ("query", "at")): "An `at` with an offset may lie past the year 9999 in UTC",
    (SCORE, ("body", "occurred_at")): (
        "occurred_at lies within the allowed lateness and the future tolerance of the server's "
        "clock"
    ),
    (SCORE, ("body", "value")): (
        "value lies within the board's own min_value and max_value, and the user's new total "
        "must stay exactly rankable: the board's definition and the stored score"
    ),
    (SCORE, ("body", "event_id")): "A body event_id must equal the Idempotency-Key header",
    (BATCH, ("header", "Idempotency-Key")): (
        "A batch takes no Idempotency-Key header (each event carries its own event_id): a "
        "header the operation does not declare"
    ),
    (SCORE, ("body", "region")): (
        "region is one of the regions the board declares, where it declares them: the board's "
        "definition"
    ),
    (SCORE, ("body", "subscore")): (
        "subscore is required on a board with a subscore_order and refused on any other: the "
        "board's definition"
    ),
    (SCORE, ("body", "metadata")): (
        "metadata takes at most 1024 bytes as compact JSON: a size of the serialised object, "
        "which no JSON Schema keyword measures"
    ),
    (SCORE, ("body", "display_name")): (
        "display_name is printable (Python's str.isprintable: no control, format, separator, "
        "private-use or unassigned characters) and not spaces only, a set of code points that "
        "changes with each Unicode version and that no pattern can list"
    ),
    (PUT_BOARD, ("body", "timezone")): "A timezone is a name the server's tz database knows",
    (PUT_BOARD, ("body", "schedule")): (
        "A schedule is a 5-field cron expression that croniter reads and that fires: a grammar "
        "no pattern states"
    ),
    (PUT_BOARD, ("body",)): (
        "min_value may not exceed max_value, subscore_order is refused on incr boards, a "
        "board with player_writes declares its regions, and the period season needs a "
        "schedule: fields bounded by others"
    ),
    (PUT_BOARD, ("body", "board_id")): (
        "A body's board_id, which a definition read with GET carries, must be the path's: a "
        "field bound to a path parameter"
    ),
    (BEFRIEND, ("path", "friend_id")): "A user cannot befriend itself: two path parameters differ",
}


# A schema-valid value that is no integer (pydantic's int_type) can only be a number with a zero
# fraction: JSON Schema's "integer" takes 25.0, and Ladder's integers are JSON's own.
INTEGRAL = "An integer is written without a fraction: 25.0 is refused (docs/api.md section 1)"


def refusal_reason(case: schemathesis.Case, response: Any) -> str | None:
    """Why the server refused a schema-valid request, if every error of its 422 is listed in
    :data:`REFUSALS`."""
    if response.status_code != 422:
        return None
    errors = response.json().get("errors") or []
    reasons = [
        INTEGRAL
        if error.get("type") == "int_type"
        else REFUSALS.get((case.operation.label, at)) or REFUSALS.get(("*", at))
        for error in errors
        for at in (tuple(error["loc"][:2]),)
    ]
    if not reasons or None in reasons:
        return None
    return "; ".join(sorted(set(filter(None, reasons))))


def documented(failure: Failure, case: schemathesis.Case, response: Any) -> str | None:
    """The reason a finding is a documented exception, or ``None``."""
    if failure.code == "ST202":  # a schema-valid request refused
        return refusal_reason(case, response)
    return None


def bind(case: schemathesis.Case, client: asgi.ASGIClient) -> dict[str, Any]:
    """The transport of a call to the app under test. Schemathesis sends its probes (a request
    again without the credential) through the schema's app rather than the session."""
    case.operation.app = case.operation.schema.app = client.app
    return {"session": client, "base_url": client.base_url, "headers": ADMIN}


def validate(case: schemathesis.Case, response: Any, run_checks: Callable[[], None]) -> None:
    """Run the checks; let through only the findings that are documented exceptions."""
    try:
        run_checks()
    except FailureGroup as group:
        if any(documented(failure, case, response) is None for failure in group.exceptions):
            raise


def _fits(context: schemathesis.HookContext, where: str, name: str, value: Any) -> bool:
    """Whether ``value`` fits the documented type, pattern and length of a parameter.

    A seeded value stands in for a generated one only where both fit: a value that does not is
    one Schemathesis made to be refused, and must stay so.
    """
    operation = context.operation
    assert operation is not None
    declared = DOCUMENT["paths"][operation.path][operation.method.lower()]["parameters"]
    schema = next(p["schema"] for p in declared if p["in"] == where and p["name"] == name)
    schema = next((s for s in schema.get("anyOf", ()) if s.get("type") != "null"), schema)
    if schema.get("type") == "array":
        return (
            isinstance(value, list)
            and len(value) <= schema.get("maxItems", len(value))
            and all(_fits_string(schema["items"], item) for item in value)
        )
    return _fits_string(schema, value)


def _fits_string(schema: dict[str, Any], value: Any) -> bool:
    pattern = schema.get("pattern")
    # ASCII: \d in the document's (ECMA-262) patterns is 0-9 only.
    return (
        isinstance(value, str)
        and len(value) <= schema.get("maxLength", len(value))
        and (pattern is None or re.search(pattern, value, re.ASCII) is not None)
    )


def _or_seeded(
    context: schemathesis.HookContext, where: str, name: str, value: Any, seeded: tuple[Any, ...]
) -> st.SearchStrategy[Any]:
    """``value``, or as often one of the ``seeded`` values that fit where it goes."""
    if not _fits(context, where, name, value):
        return st.just(value)
    fitting = [v for v in seeded if _fits(context, where, name, v)]
    return st.sampled_from((*fitting, value))


@schema.hook
def flatmap_path_parameters(
    context: schemathesis.HookContext, path: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """Ids that name the seeded boards and users as often as generated ones."""
    if not isinstance(path, dict):
        return st.just(path)
    users = tuple(user for user, _, _ in PLAYERS)
    seeded = {
        "board_id": tuple(board.board_id for board in BOARDS),
        "user_id": users,
        "friend_id": users,
    }
    return st.fixed_dictionaries(
        {
            name: _or_seeded(context, "path", name, value, seeded[name])
            if name in seeded
            else st.just(value)
            for name, value in path.items()
        }
    )


@schema.hook
def flatmap_query(
    context: schemathesis.HookContext, query: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """Scopes that name seeded views, and current and extreme period ids, as often as
    generated ones."""
    if not isinstance(query, dict):
        return st.just(query)
    choices: dict[str, st.SearchStrategy[Any]] = {}
    for name, value in query.items():
        if name == "scope":
            choices[name] = _or_seeded(context, "query", name, value, SCOPES)
        elif name == "period_id" and isinstance(value, list):
            ids = tuple((pid,) for pid in PERIOD_IDS) + tuple(itertools.pairwise(PERIOD_IDS))
            choices[name] = _or_seeded(context, "query", name, value, tuple(map(list, ids)))
        elif name == "period_id":
            choices[name] = _or_seeded(context, "query", name, value, PERIOD_IDS)
        else:
            choices[name] = st.just(value)
    return st.fixed_dictionaries(choices)


# --- seeding ----------------------------------------------------------------------------------


def _history_event(n: int, user: str, region: str, team: str, at: datetime) -> ScoreAccepted:
    return ScoreAccepted.model_validate(
        {
            "event_id": f"seed-{n}",
            "board_id": "main",
            "user_id": user,
            "region": region,
            "team_id": team,
            "value": 10 * n,
            "occurred_at": at,
            "accepted_at": at,
            "periods": {
                "alltime": {
                    "period_id": "all",
                    "score": 10 * n,
                    "rank": 1,
                    "previous_rank": None,
                    "improved": True,
                }
            },
        }
    )


def _snapshot(scope: str, taken_at: datetime) -> SnapshotRow:
    entries: list[dict[str, Any]] = [
        {"rank": 1, "user_id": "u-1", "score": 20, "display_name": "Bo"},
        {"rank": 2, "user_id": "u-42", "score": 10, "display_name": None},
    ]
    if scope == "teams":
        entries = [
            {"rank": 1, "team_id": "blue", "score": 20},
            {"rank": 2, "team_id": "red", "score": 10},
        ]
    return {
        "board_id": "main",
        "scope": scope,
        "period": "alltime",
        "period_id": "all",
        "taken_at": taken_at,
        "entries": entries,
    }


@pytest.fixture
async def history(settings: LadderSettings, mysql_database: str) -> AsyncIterator[None]:
    """Events and snapshots in the history database, as the history service stores them."""
    at = datetime.now(UTC) - timedelta(hours=1)
    async with open_engine(settings.mysql_url) as engine:
        await HistoryHandler(engine)(
            [_history_event(n, *player, at) for n, player in enumerate(PLAYERS * 2, 1)]
        )
        await save_snapshots(engine, [_snapshot(s, at) for s in ("global", "region:eu", "teams")])
    yield


# The seeded events as the aggregator receives them (from the write's answers), for ``merged``
# to derive: the broker is the test's own, and nothing consumes it here.
_SEEDED: list[ScoreAccepted] = []


def _seeded_event(body: dict[str, Any], answer: dict[str, Any]) -> ScoreAccepted:
    now = datetime.now(UTC)
    fields = {k: body[k] for k in ("user_id", "region", "team_id", "value")}
    return ScoreAccepted.model_validate(
        {
            **fields,
            "event_id": answer["event_id"],
            "board_id": answer["board_id"],
            "occurred_at": now,
            "accepted_at": now,
            "periods": answer["periods"],
        }
    )


def _seed(client: asgi.ASGIClient) -> None:
    """Board ``races`` (another operator and order) and, through the API, scores on both
    boards and friends."""
    _SEEDED.clear()
    races = RACES.model_dump(mode="json", exclude={"board_id"})
    calls: list[tuple[str, str, dict[str, Any] | None]] = [("PUT", "/v1/boards/races", races)]
    for n, (user, region, team) in enumerate(PLAYERS * 2):
        score = {"user_id": user, "region": region, "team_id": team, "value": 3 + 7 * n}
        for board in BOARDS:
            calls.append(("POST", f"/v1/boards/{board.board_id}/scores", score))
    calls += [("PUT", f"/v1/users/u-42/friends/{user}", None) for user in ("u-1", "u-2")]
    for method, path, body in calls:
        response = client.request(method, path, json=body, headers=ADMIN)
        assert response.status_code < 300, (path, response.status_code, response.text)
        if path.endswith("/scores") and body is not None:
            _SEEDED.append(_seeded_event(body, response.json()))


@pytest.fixture
def api(
    settings: LadderSettings, redis: Redis, broker: Topology, history: None
) -> Iterator[asgi.ASGIClient]:
    """A client of the API run in-process on the test's own prefixes and
    database; the seeded scores reach the test's own exchange."""
    # Rate limits high enough that 429s (documented, but dull) do not drown the rest.
    app = create_app(settings.model_copy(update={"user_rate": 1e6, "key_rate": 1e6}))
    try:
        with asgi.get_client(app) as client:
            _seed(client)
            yield client
    finally:
        # The lifespan closes its connections before the fixtures drop what they made.
        asgi.shutdown_lifespans()
    _each_accepted_event_reads_as_the_consumers_read_it(settings)


def _each_accepted_event_reads_as_the_consumers_read_it(settings: LadderSettings) -> None:
    """Whatever the run got accepted is in the history queue the API declared, or still in a
    board's outbox: each message, and each outbox entry in a message as the relay sends it,
    must pass the consumers' schema. One event the API takes but a consumer refuses would have
    its whole message, other users' events with it, dead-lettered."""
    bodies = asyncio.run(_queued(settings, Topology(prefix=settings.broker_prefix)))
    keys = Keys(settings.key_prefix)
    with SyncRedis.from_url(settings.redis_url, decode_responses=True) as redis:
        for board in BOARDS:
            bodies += [
                message_body([with_outbox_id(entry_id, fields["e"])])
                for entry_id, fields in redis.xrange(keys.outbox(board.board_id))
            ]
    assert bodies, "the run accepted no event"
    for body in bodies:
        ScoreMessage.model_validate_json(body)


async def _queued(settings: LadderSettings, topology: Topology) -> list[bytes]:
    """The bodies of the messages in the test's history queue, if it was declared."""
    bodies: list[bytes] = []
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(topology.queue("history"), passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return bodies
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            bodies.append(message.body)
    return bodies


@pytest.fixture
async def merged(api: asgi.ASGIClient, redis: Redis, keys: Keys) -> None:
    """The views derived from the seeded scores (the users' regions and teams, the feed, the
    stats) and the global view, as the aggregator derives and merges them."""
    now = datetime.now(UTC)
    for board in BOARDS:
        events = [e for e in _SEEDED if e.board_id == board.board_id]
        assert await derive(redis, keys, board, events, LadderSettings().feed_length) > 0
        await redis.sadd(
            keys.dirty(board.board_id),
            *[
                dirty_member(period, window_at(period, now, board.timezone).period_id, r, user)
                for period in board.periods
                for user, r, _ in PLAYERS
            ],
        )
        assert await Merger(redis, keys).merge_board(board) > 0


# --- the test ---------------------------------------------------------------------------------


@schema.parametrize()
@hypothesis.settings(REPEATABLE, max_examples=MAX_EXAMPLES)
def test_api_conforms_to_its_openapi(
    case: schemathesis.Case, api: asgi.ASGIClient, merged: None
) -> None:
    transport = bind(case, api)
    response = case.call(**transport)
    validate(
        case,
        response,
        lambda: case.validate_response(response, headers=ADMIN, transport_kwargs=transport),
    )


class Workflow(schema.as_state_machine()):  # type: ignore[misc]
    """The stateful phase: each run is a sequence of calls, each following a link from the
    answer before it."""

    client: ClassVar[asgi.ASGIClient]

    def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
        return bind(case, self.client)

    def validate_response(
        self, response: Any, case: schemathesis.Case, additional_checks: Any = None, **kwargs: Any
    ) -> None:
        base = super()

        def run_checks() -> None:
            base.validate_response(response, case, additional_checks, **kwargs)

        validate(case, response, run_checks)


def test_api_conforms_to_its_openapi_through_linked_calls(
    api: asgi.ASGIClient, merged: None
) -> None:
    Workflow.client = api
    Workflow.run(
        settings=hypothesis.settings(
            REPEATABLE, max_examples=STATEFUL_RUNS, stateful_step_count=STATEFUL_STEPS
        )
    )


def test_what_the_document_offers_without_a_credential_is_served_without_one(
    api: asgi.ASGIClient, merged: None
) -> None:
    """Each operation without a credential: served if its security holds the empty requirement
    (public reads), else 401. Schemathesis sends its anonymous requests only where a credential
    is required; this covers the others."""
    names = {"board_id": "main", "user_id": "u-42", "friend_id": "u-1"}
    score = {"user_id": "u-42", "region": "eu", "value": 1}
    # Bodies that pass validation: without a credential they get their 401 all the same.
    bodies = {
        SCORE: score,
        "POST /v1/boards/{board_id}/scores/batch": {"events": [score]},
        PUT_BOARD: {},
    }
    expected, answered = {}, {}
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            if "security" not in operation:
                continue
            label = f"{method.upper()} {path}"
            response = api.request(method, path.format(**names), json=bodies.get(label))
            expected[label] = 200 if {} in operation["security"] else 401
            answered[label] = response.status_code
    assert answered == expected
    assert 200 in expected.values() and 401 in expected.values()
