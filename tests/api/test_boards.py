"""Board definitions (docs/api.md section 3): written by an admin key, kept in MySQL, restored into
a Redis that lost them, and locked against re-ranking once a board has scores."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema_rs
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from services.api.routes import definitions
from services.api.routes.definitions import _regions_sets
from services.history.handlers import HistoryHandler
from services.history.migrate import migrate
from shared.boards import MAIN_BOARD, Board, BoardCatalog
from shared.db import open_engine
from shared.db_boards import load_boards, save_board
from shared.events import PeriodResult, ScoreAccepted
from shared.keys import Keys
from shared.ranking import MAX_SCORE
from shared.settings import LadderSettings
from tests.api.helpers import MAIN, assert_problem
from tests.helpers import (
    ADMIN,
    SERVER,
    UNREACHABLE_BROKER,
    api_client,
    eventually,
    player,
    snapshot,
)

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

LAPS = {
    "operator": "best",
    "order": "asc",
    "subscore_order": None,
    "periods": ["weekly", "alltime"],
    "timezone": "Europe/Paris",
    "min_value": 1,
    "max_value": 600,
    "retention": {"daily": 7, "weekly": 4, "monthly": 3, "season": 12},
    "notify_top": [1, 3],
    "player_writes": True,
    "regions": ["eu", "na"],
    "badges": {"sub-60": 60},
    "schedule": None,
}


@pytest.fixture
def quiet(quiet: LadderSettings, mysql_database: str) -> LadderSettings:
    """The suite's quiet settings, on the test's own migrated database."""
    return quiet


async def put(client: Any, board_id: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await client.put(f"/v1/boards/{board_id}", json=body, headers=ADMIN)
    assert response.status_code == status, response.text
    return response


# --- create, update, read --------------------------------------------------------------------


async def test_put_creates_then_updates_and_reads_show_every_field(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        created = await put(client, "laps", LAPS, 201)
        read = await client.get("/v1/boards/laps")
        updated = await put(client, "laps", LAPS | {"notify_top": [5, 1]})
        defaults = await put(client, "plain", {}, 201)
        listed = await client.get("/v1/boards")

    assert created.json() == {"board_id": "laps", **LAPS}
    assert created.headers["location"] == "/v1/boards/laps"
    assert read.json() == created.json()
    assert updated.json() == {"board_id": "laps", **LAPS, "notify_top": [1, 5]}
    # A field left out takes board main's default.
    assert defaults.json() == MAIN | {"board_id": "plain"}
    assert [b["board_id"] for b in listed.json()["boards"]] == ["laps", "main", "plain"]
    assert listed.json()["boards"][0] == updated.json()

    async with open_engine(quiet.mysql_url) as engine:
        stored = {b.board_id: b.model_dump(mode="json") for b in await load_boards(engine)}
    assert stored == {b["board_id"]: b for b in listed.json()["boards"]}


async def test_a_definition_read_back_from_get_may_be_put_again(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        read = (await client.get("/v1/boards/main")).json()
        again = await put(client, "main", read | {"notify_top": [1]})

    assert again.json() == MAIN | {"notify_top": [1]}


async def test_the_document_takes_a_definition_read_back(quiet: LadderSettings) -> None:
    """The PUT body's schema allows the ``board_id`` a GET answers with, as the page says."""
    async with api_client(quiet) as client:
        read = (await client.get("/v1/boards/main")).json()
        document = (await client.get("/openapi.json")).json()
    put_body = document["paths"]["/v1/boards/{board_id}"]["put"]["requestBody"]
    schema = put_body["content"]["application/json"]["schema"]
    validator = jsonschema_rs.validator_for({**schema, "components": document["components"]})
    assert validator.is_valid(read), list(validator.iter_errors(read))


async def test_the_document_requires_every_field_a_definition_is_answered_with(
    quiet: LadderSettings,
) -> None:
    """A definition as answered carries every field, and the document says so: a client made
    from it had every field but ``board_id`` optional."""
    async with api_client(quiet) as client:
        read = (await client.get("/v1/boards/main")).json()
        document = (await client.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    answered = document["paths"]["/v1/boards/{board_id}"]["get"]["responses"]["200"]
    assert answered["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Board"
    }
    assert sorted(schemas["Board"]["required"]) == sorted(read)
    # Retention stays one component, a PUT's and an answer's alike (a client's type).
    assert schemas["Board"]["properties"]["retention"] == {
        "$ref": "#/components/schemas/Retention",
        "default": read["retention"],
    }


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("put", "/v1/boards/{board_id}", "201"),
        ("delete", "/v1/boards/{board_id}", "202"),
        ("delete", "/v1/users/{user_id}", "202"),
    ],
)
async def test_the_document_declares_each_location_answered(
    quiet: LadderSettings, method: str, path: str, status: str
) -> None:
    """A made board, a deletion and an erasure answer with a ``Location``, which the
    document's responses left out."""
    async with api_client(quiet) as client:
        document = (await client.get("/openapi.json")).json()
    headers = document["paths"][path][method]["responses"][status].get("headers", {})
    assert headers.get("Location", {}).get("schema") == {"type": "string"}


async def test_a_schedule_s_season_is_stored_last(quiet: LadderSettings) -> None:
    body = {"periods": ["season", "daily"], "schedule": "0 18 * * 5"}
    async with api_client(quiet) as client:
        made = await put(client, "cup", body, status=201)
    assert made.json()["periods"] == ["daily", "season"]


async def test_only_an_admin_key_writes_definitions(quiet: LadderSettings, redis: Redis) -> None:
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        refused = {
            401: [await client.put("/v1/boards/laps", json=LAPS)],
            403: [
                await client.put("/v1/boards/laps", json=LAPS, headers=SERVER),
                await client.put("/v1/boards/laps", json=LAPS, headers=player("u-1")),
                await client.put("/v1/boards/main", json={}, headers=player("u-1")),
            ],
        }
        # The credential is judged before the body.
        refused[401].append(await client.put("/v1/boards/laps", json={"operator": "nope"}))
        after = await snapshot(redis, quiet.key_prefix)
        missing = await client.get("/v1/boards/laps")

    for status, responses in refused.items():
        for response in responses:
            assert_problem(response, status)
    assert after == before
    assert_problem(missing, 404)
    async with open_engine(quiet.mysql_url) as engine:
        assert [b.board_id for b in await load_boards(engine)] == ["main"]


@pytest.mark.parametrize(
    ("board_id", "body", "loc"),
    [
        ("laps", {"colour": "red"}, "colour"),
        ("laps", {"operator": "max"}, "operator"),
        ("laps", {"periods": []}, "periods"),
        ("laps", {"periods": ["daily", "daily"]}, "periods"),
        ("laps", {"timezone": "Mars/Olympus"}, "timezone"),
        # A host's file and croniter's R: only a board stored with one may keep it.
        ("laps", {"timezone": "localtime"}, "timezone"),
        ("laps", {"schedule": "R 0 * * *"}, "schedule"),
        ("laps", {"min_value": 10, "max_value": 1}, None),
        ("laps", {"max_value": MAX_SCORE + 1}, "max_value"),
        ("laps", {"min_value": -MAX_SCORE - 1}, "min_value"),
        ("laps", {"min_value": 1.5}, "min_value"),
        # JSON's integers and booleans only, as for scores: a lax true was a max_value of 1.
        ("laps", {"max_value": True}, "max_value"),
        ("laps", {"max_value": "500"}, "max_value"),
        ("laps", {"max_value": 500.0}, "max_value"),
        ("laps", {"retention": {"daily": "7"}}, "daily"),
        ("laps", {"notify_top": [True]}, "0"),
        ("laps", {"badges": {"gold": 25.0}}, "gold"),
        ("laps", {"player_writes": 1, "regions": ["eu"]}, "player_writes"),
        ("laps", {"player_writes": "yes", "regions": ["eu"]}, "player_writes"),
        ("laps", {"retention": {"hourly": 3}}, "hourly"),
        ("laps", {"notify_top": [0]}, "0"),
        ("laps", {"badges": {"Gold!": 1}}, None),
        ("laps", {"board_id": "other"}, "board_id"),
        ("Laps", {}, "board_id"),
        ("x" * 33, {}, "board_id"),
    ],
)
async def test_an_invalid_definition_is_422_and_stores_nothing(
    quiet: LadderSettings, redis: Redis, board_id: str, body: dict[str, Any], loc: str | None
) -> None:
    async with api_client(quiet) as client:
        before = await snapshot(redis, quiet.key_prefix)
        response = await client.put(f"/v1/boards/{board_id}", json=body, headers=ADMIN)
        after = await snapshot(redis, quiet.key_prefix)

    problem = assert_problem(response, 422)
    if loc is not None:
        assert any(str(e["loc"][-1]) == loc for e in problem["errors"]), problem
    assert after == before


async def test_a_body_that_is_not_an_object_is_refused(quiet: LadderSettings) -> None:
    async with api_client(quiet) as client:
        not_json = await client.put(
            "/v1/boards/laps",
            content=b"{",
            headers=ADMIN | {"Content-Type": "application/json"},
        )
        a_list = await client.put("/v1/boards/laps", json=[], headers=ADMIN)

    assert_problem(not_json, 400)
    assert_problem(a_list, 422)


# --- what may change once a board has scores -------------------------------------------------


@pytest.mark.parametrize(
    "change", [{"operator": "best"}, {"order": "asc"}, {"timezone": "Asia/Tokyo"}]
)
async def test_ranking_fields_are_locked_once_the_board_has_a_score(
    quiet: LadderSettings, redis: Redis, change: dict[str, Any]
) -> None:
    async with api_client(quiet) as client:
        await put(client, "arena", {}, 201)
        # Before any score the board may still change how it ranks.
        await put(client, "arena", change)
        await put(client, "arena", {})
        scored = await client.post(
            "/v1/boards/arena/scores",
            json={"user_id": "u-1", "region": "eu", "value": 5},
            headers=SERVER,
        )
        assert scored.status_code == 200, scored.text
        before = await snapshot(redis, quiet.key_prefix)
        refused = await client.put("/v1/boards/arena", json=change, headers=ADMIN)
        after = await snapshot(redis, quiet.key_prefix)
        harmless = await put(client, "arena", {"notify_top": [1, 10], "max_value": 50})
        read = await client.get("/v1/boards/arena")

    problem = assert_problem(refused, 409)
    assert next(iter(change)) in problem["detail"]
    assert after == before
    assert (
        harmless.json()
        == read.json()
        == MAIN
        | {
            "board_id": "arena",
            "notify_top": [1, 10],
            "max_value": 50,
        }
    )


async def test_the_scores_check_of_a_long_kept_board_holds_no_other_request(
    quiet: LadderSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a board has scores asks for the regions set of every period it may keep: 10,000
    seasons are a walk of 10,000 firings, which ran on the event loop and held every other
    request of the API for as long as the walk took (about a second). The walk is watched where
    it runs: never in a thread that has a running event loop. (Timing the loop's stalls against
    the walk failed on a busy machine, whose own stalls reach the walk's length.)"""
    long_kept = {
        "schedule": "0,1 * * * *",
        "timezone": "Europe/Berlin",
        "retention": {"daily": 3660, "weekly": 520, "monthly": 120, "season": 10_000},
    }
    walks: list[tuple[bool, int]] = []

    def watched(keys: Keys, board: Board, latest: datetime) -> list[str]:
        try:
            asyncio.get_running_loop()
            on_a_loop = True
        except RuntimeError:
            on_a_loop = False
        names = _regions_sets(keys, board, latest)
        walks.append((on_a_loop, len(names)))
        return names

    monkeypatch.setattr(definitions, "_regions_sets", watched)
    async with api_client(quiet) as client:
        await put(client, "cup", long_kept, 201)
        changed = await put(client, "cup", long_kept | {"operator": "best"})

    assert changed.json()["operator"] == "best"
    assert walks, "the scores check never walked the board's periods"
    # Every season of a minute kept is a name to ask for: the walk is the long one.
    assert all(not on_a_loop and names > 10_000 for on_a_loop, names in walks), walks


async def test_scores_in_the_history_database_lock_the_board_too(quiet: LadderSettings) -> None:
    """A board whose cached views are gone (a Redis restart) still has its scores in MySQL."""
    now = datetime.now(UTC)
    event = ScoreAccepted(
        event_id="e-1",
        board_id="arena",
        user_id="u-1",
        region="eu",
        value=5,
        occurred_at=now - timedelta(days=400),
        accepted_at=now - timedelta(days=400),
        periods={
            "alltime": PeriodResult(
                period_id="all", score=5, rank=1, previous_rank=None, improved=True
            )
        },
    )
    async with api_client(quiet) as client:
        await put(client, "arena", {}, 201)
        async with open_engine(quiet.mysql_url) as engine:
            await HistoryHandler(engine)([event])
        refused = await client.put("/v1/boards/arena", json={"order": "asc"}, headers=ADMIN)

    assert_problem(refused, 409)


# --- surviving a restart ---------------------------------------------------------------------


async def test_definitions_survive_a_restart_that_empties_redis(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await put(client, "laps", LAPS, 201)
        await put(client, "main", {"notify_top": [1, 5]})

    await redis.delete(keys.boards)
    # Another service (the aggregator) comes up first and puts the default main there.
    await BoardCatalog(redis, keys).ensure_defaults()

    async with api_client(quiet) as client:
        laps = await client.get("/v1/boards/laps")
        main = await client.get("/v1/boards/main")

    assert laps.status_code == 200
    assert laps.json() == {"board_id": "laps", **LAPS}
    assert main.json() == MAIN | {"notify_top": [1, 5]}


async def test_a_definition_stored_before_a_check_reads_and_may_be_kept(
    quiet: LadderSettings, redis: Redis
) -> None:
    """A timezone that names a host's file, and a schedule using croniter's R, were taken before
    they were refused: such a stored board still reads, and a PUT may keep what it holds (but
    bring in neither), where the API once refused to start and every read of the catalog
    failed."""
    legacy = {
        "host": MAIN | {"board_id": "host", "timezone": "localtime"},
        "picked": MAIN | {"board_id": "picked", "schedule": "R 0 * * *"},
    }
    legacy["picked"]["periods"] = [*MAIN["periods"], "season"]
    async with open_engine(quiet.mysql_url) as engine, engine.begin() as conn:
        for board_id, definition in legacy.items():
            await conn.execute(
                text("INSERT INTO boards VALUES (:id, :definition, NOW(6), NOW(6))"),
                {"id": board_id, "definition": json.dumps(definition)},
            )

    async with api_client(quiet) as client:
        listed = await client.get("/v1/boards")
        host = await client.get("/v1/boards/host")
        written = await client.post(
            "/v1/boards/host/scores",
            json={"user_id": "u-1", "region": "eu", "value": 5},
            headers=SERVER,
        )
        kept = await put(client, "host", legacy["host"] | {"notify_top": [1]})
        before = await snapshot(redis, quiet.key_prefix)
        elsewhere = await client.put(
            "/v1/boards/other", json=legacy["host"] | {"board_id": "other"}, headers=ADMIN
        )
        changed = await client.put(
            "/v1/boards/host", json=legacy["host"] | {"schedule": "R 1 * * *"}, headers=ADMIN
        )
        after = await snapshot(redis, quiet.key_prefix)

    assert listed.status_code == 200, listed.text
    assert [b["board_id"] for b in listed.json()["boards"]] == ["host", "main", "picked"]
    assert host.json() == legacy["host"]
    assert written.status_code == 200, written.text
    assert kept.json() == legacy["host"] | {"notify_top": [1]}
    assert_problem(elsewhere, 422)
    assert_problem(changed, 422)
    assert after == before


async def test_main_is_stored_in_mysql_at_start(quiet: LadderSettings) -> None:
    async with api_client(quiet):
        pass
    async with open_engine(quiet.mysql_url) as engine:
        assert await load_boards(engine) == [MAIN_BOARD]


async def test_with_mysql_away_at_start_definitions_come_back_once_it_is(
    settings: LadderSettings, redis: Redis, keys: Keys, mysql_database: str
) -> None:
    base, _, name = settings.mysql_url.rpartition("/")
    late = settings.model_copy(
        update={
            "amqp_url": UNREACHABLE_BROKER,
            "shutdown_grace_seconds": 1.0,
            "mysql_url": f"{base}/{name}_late",
        }
    )
    try:
        async with api_client(late) as client:
            # No database yet: the API serves with what Redis holds.
            assert (await client.get("/v1/boards/main")).status_code == 200
            assert (await client.get("/v1/boards/laps")).status_code == 404
            await migrate(late.mysql_url)
            async with open_engine(late.mysql_url) as engine:
                await save_board(engine, Board.model_validate({"board_id": "laps", **LAPS}))

            async def restored() -> bool:
                return (await client.get("/v1/boards/laps")).status_code == 200

            await eventually(restored, within=10)
    finally:
        server = create_async_engine(base)
        async with server.begin() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS `{name}_late`"))
        await server.dispose()


async def test_concurrent_puts_leave_redis_as_mysql(
    quiet: LadderSettings, redis: Redis, keys: Keys
) -> None:
    async with api_client(quiet) as client:
        await asyncio.gather(
            *(
                client.put(f"/v1/boards/b{i % 3}", json={"notify_top": [i + 1]}, headers=ADMIN)
                for i in range(12)
            )
        )
    async with open_engine(quiet.mysql_url) as engine:
        stored = {b.board_id: b for b in await load_boards(engine)}
    cached = {b.board_id: b for b in await BoardCatalog(redis, keys).all()}
    assert cached == stored
    assert sorted(stored) == ["b0", "b1", "b2", "main"]
