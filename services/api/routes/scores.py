"""Score submission (API.md section 4)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from prometheus_client import Counter, Histogram

from services.api import limits
from services.api.auth import bearer
from services.api.errors import Forbidden, Unauthorized
from services.api.state import BoardDep, Caller, State
from services.api.writes import ScoreIn, ScoreOut, resolve_event_id, submit
from shared.events import EVENT_ID_PATTERN

router = APIRouter(prefix="/v1/boards/{board_id}", tags=["scores"])

SCORES = Counter("ladder_api_scores_total", "Score submissions answered", ["outcome"])
WRITE_SECONDS = Histogram(
    "ladder_api_score_write_seconds",
    "Time of the atomic score write",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"description": text, "content": {"application/problem+json": {}}}
    for code, text in {
        400: "Malformed JSON",
        401: "Missing or invalid credential",
        403: "Credential not allowed",
        404: "Unknown board",
        409: "The event_id was accepted with another body",
        413: "Body too large (limit 1 MiB)",
        422: "Validation failed",
        429: "Rate limited (with Retry-After)",
        503: "A dependency is down (with Retry-After)",
    }.items()
}


@router.post("/scores", response_model=ScoreOut, responses=PROBLEMS)
async def post_score(
    score: ScoreIn,
    request: Request,
    board: BoardDep,
    caller: Caller,
    state: State,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", pattern=EVENT_ID_PATTERN)
    ] = None,
) -> dict[str, Any]:
    """Submit one score; answers with the user's regional score and rank in every period.

    A server key may submit for any user; a player token only for itself, and only on a board
    with ``player_writes``. Repeating an accepted ``event_id`` with the same body answers the
    first result with ``duplicate: true``.
    """
    if caller.kind == "anonymous":
        raise Unauthorized("Submitting scores needs a server key or a player token.")
    if not caller.is_server:
        if not board.player_writes:
            raise Forbidden("Players may not submit scores to this board.")
        if caller.user_id != score.user_id:
            raise Forbidden("A player token may submit only its own scores.")
    event_id = resolve_event_id(score, idempotency_key)
    credential = bearer(request.headers.get("authorization")) or ""
    await limits.take(state.redis, state.keys, state.settings, caller, credential, [score.user_id])
    with WRITE_SECONDS.time():
        result = await submit(state.redis, state.keys, state.settings, board, score, event_id)
    SCORES.labels("duplicate" if result["duplicate"] else "accepted").inc()
    state.relay.wake()
    return result
