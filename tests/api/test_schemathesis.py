"""Schemathesis against the API's own OpenAPI document (docs/api.md sections 1 and 10).

The real app runs in-process (over ASGI, lifespan and all) on the test's own Redis prefix, broker
prefix and MySQL database, one app per operation. Every request carries the admin key, which may
do everything, so that operations get past authentication to their real work. Two boards, scores
(merged into the global view as the aggregator would), friends, history events and snapshots are
seeded first, and the generated ids and scopes name them as often as not, so that reads find
something to read. For every generated request: no server error, a documented status code, a
documented content type, the documented headers and a body that matches its documented schema.

Bounded for CI: a fixed budget of examples per operation and a deterministic seed, so that two
runs send the same requests. ``-m "not fuzz"`` skips it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from redis.asyncio import Redis
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.aggregator.merge import Merger
from services.api.app import create_app
from services.history.handlers import HistoryHandler
from shared.boards import MAIN_BOARD, Board
from shared.db import open_engine
from shared.db_boards import SnapshotRow, save_snapshots
from shared.events import ScoreAccepted
from shared.keys import Keys, dirty_member
from shared.periods import PERIODS, window_at
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.helpers import ADMIN

pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning"),
]

# Examples per operation in the fuzzing phase, after the schema's examples and the coverage
# phase's boundary cases: the whole file takes about 80 seconds on two cores.
MAX_EXAMPLES = 400
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

RACES = Board(
    board_id="races",
    operator="best",
    order="asc",
    periods=("daily", "alltime"),
    player_writes=True,
    badges={"podium": 10},
)
BOARDS = (MAIN_BOARD, RACES)
# user, region, team: u-42 is the user of the document's examples.
PLAYERS = (("u-42", "eu", "red"), ("u-1", "eu", "blue"), ("u-2", "na", "red"))
SCOPES = ("global", "region:eu", "region:na", "teams", "friends:u-42")
# The current periods, and periods at the edges of the calendar.
PERIOD_IDS = (
    *(window_at(period, datetime.now(UTC), "UTC").period_id for period in PERIODS),
    *("0001-01-01", "0001-W01", "0001-01", "9999-12-31", "9999-W52", "9999-12"),
)

# The document as the app serves it at /openapi.json; building the app connects to nothing.
schema = schemathesis.openapi.from_dict(
    create_app(LadderSettings(_env_file=None, env="dev")).openapi()  # type: ignore[call-arg]
)


@schema.hook
def flatmap_path_parameters(
    _: schemathesis.HookContext, path: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """Ids that name the seeded boards and users as often as generated ones."""
    if not isinstance(path, dict):
        return st.just(path)
    users = tuple(user for user, _, _ in PLAYERS)
    choices = {
        "board_id": tuple(board.board_id for board in BOARDS),
        "user_id": users,
        "friend_id": users,
    }
    return st.fixed_dictionaries(
        {
            name: st.sampled_from((*choices[name], value)) if name in choices else st.just(value)
            for name, value in path.items()
        }
    )


@schema.hook
def flatmap_query(
    _: schemathesis.HookContext, query: dict[str, Any] | None
) -> st.SearchStrategy[dict[str, Any] | None]:
    """Scopes that name seeded views, and current and extreme period ids, as often as
    generated ones."""
    if not isinstance(query, dict):
        return st.just(query)
    choices: dict[str, st.SearchStrategy[Any]] = {}
    for name, value in query.items():
        if name == "scope":
            choices[name] = st.sampled_from((*SCOPES, value))
        elif name == "period_id" and isinstance(value, list):
            ids = st.lists(st.sampled_from(PERIOD_IDS), min_size=1, max_size=2)
            choices[name] = st.one_of(st.just(value), ids)
        elif name == "period_id":
            choices[name] = st.sampled_from((*PERIOD_IDS, value))
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


def _seed(client: asgi.ASGIClient) -> None:
    """Board ``races`` (another operator and order) and, through the API, scores on both
    boards and friends."""
    races = RACES.model_dump(mode="json", exclude={"board_id"})
    calls: list[tuple[str, str, dict[str, Any] | None]] = [("PUT", "/v1/boards/races", races)]
    for n, (user, region, team) in enumerate(PLAYERS * 2):
        score = {"user_id": user, "region": region, "team_id": team, "value": 3 + 7 * n}
        for board in BOARDS:
            calls.append(("POST", f"/v1/boards/{board.board_id}/scores", score))
    calls += [("PUT", f"/v1/users/u-42/friends/{user}", None) for user in ("u-1", "u-2")]
    for method, path, body in calls:
        response = client.request(method, path, json=body)
        assert response.status_code < 300, (path, response.status_code, response.text)


@pytest.fixture
def api(
    settings: LadderSettings, redis: Redis, broker: Topology, history: None
) -> Iterator[asgi.ASGIClient]:
    """A client, with the admin key, of the API run in-process on the test's own prefixes and
    database; the seeded scores reach the test's own exchange."""
    # Rate limits high enough that 429s (documented, but dull) do not drown the rest.
    app = create_app(settings.model_copy(update={"user_rate": 1e6, "key_rate": 1e6}))
    try:
        with asgi.get_client(app) as client:
            client.headers.update(ADMIN)
            _seed(client)
            yield client
    finally:
        # The lifespan closes its connections before the fixtures drop what they made.
        asgi.shutdown_lifespans()


@pytest.fixture
async def merged(api: asgi.ASGIClient, redis: Redis, keys: Keys) -> None:
    """The global view of the seeded scores, as the aggregator merges it."""
    now = datetime.now(UTC)
    for board in BOARDS:
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
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
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
def test_api_conforms_to_its_openapi(
    case: schemathesis.Case, api: asgi.ASGIClient, merged: None
) -> None:
    case.call_and_validate(session=api, base_url=api.base_url, checks=CHECKS)
