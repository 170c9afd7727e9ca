"""What the API tests share: board main as docs/api.md section 3 defines it, valid score bodies,
times in the contract's format, a score that must be accepted, a read that must answer, and the
check that a refusal is a proper problem."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from services.api import eraser
from services.api.erased_rows import erase_from_snapshots
from shared.boards import Board
from shared.keys import Keys
from tests.helpers import ADMIN, SERVER, eventually

SCORES = "/v1/boards/main/scores"
LEADERBOARD = "/v1/boards/main/leaderboard"
JSON = {"Content-Type": "application/json"}
PROBLEM = "application/problem+json"
MiB = 1024 * 1024

# Board main as docs/api.md section 3 defines it, every field present.
MAIN = {
    "board_id": "main",
    "operator": "incr",
    "order": "desc",
    "subscore_order": None,
    "periods": ["daily", "weekly", "monthly", "alltime"],
    "timezone": "UTC",
    "min_value": -1_000_000,
    "max_value": 1_000_000,
    "retention": {"daily": 35, "weekly": 12, "monthly": 12, "season": 12},
    "notify_top": [1, 10, 100],
    "player_writes": False,
    "regions": None,
    "badges": {},
    "schedule": None,
}
PERIOD_ID_FORMATS = {
    "daily": r"^\d{4}-\d{2}-\d{2}$",
    "weekly": r"^\d{4}-W\d{2}$",
    "monthly": r"^\d{4}-\d{2}$",
    "alltime": r"^all$",
}
DROP: Any = object()


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


async def get_ok(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None, **params: Any
) -> dict[str, Any]:
    """A read that must answer 200 (as a server, unless ``headers`` says otherwise); its body."""
    response = await client.get(path, params=params, headers=SERVER if headers is None else headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def add_board(redis: Redis, keys: Keys, board: Board) -> None:
    """Store a board definition where the catalog reads it (boards have no write route yet)."""
    await redis.hset(keys.boards, board.board_id, board.model_dump_json())


async def done(client: httpx.AsyncClient, path: str) -> bool:
    """Whether the job at ``path`` (an erasure or a board deletion) says it is done."""
    response = await client.get(path, headers=ADMIN)
    assert response.status_code == 200, response.text
    return bool(response.json()["status"] == "done")


async def erase_u_a(
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    meanwhile: Callable[[], Awaitable[None]],
) -> None:
    """User u-a scores 50 and is erased, with ``meanwhile`` run during the erasure's passes after
    its cut-off (its last pass): after its hides, friendships and requests are dropped, before its
    snapshots are erased. Not in the pass made at the request: an API process may then still
    answer from what it read of the pending erasures before the request (services/api/erasing.py
    keeps it up to half a second), which the cut-off, 2 s after it, is there to outlast."""
    cutoff: datetime | None = None

    async def last_step(engine: Any, user_id: str) -> None:
        if cutoff is not None and datetime.now(UTC) > cutoff:
            await meanwhile()
        await erase_from_snapshots(engine, user_id)

    monkeypatch.setattr(eraser, "erase_from_snapshots", last_step)
    await post(client, score(user_id="u-a", value=50))
    asked = await client.delete("/v1/users/u-a", headers=ADMIN)
    assert asked.status_code == 202
    cutoff = datetime.fromisoformat(asked.json()["cutoff"])
    await eventually(lambda: done(client, "/v1/erasures/u-a"), within=30)
    monkeypatch.setattr(eraser, "erase_from_snapshots", erase_from_snapshots)


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
