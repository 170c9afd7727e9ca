"""Score submission (docs/api.md section 4)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import Counter, Histogram
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from services.api.answers import json_answer
from services.api.auth import Principal, authenticate, bearer
from services.api.erasing import refusal
from services.api.errors import (
    Conflict,
    EventProblem,
    Forbidden,
    Invalid,
    Problem,
    Unauthorized,
    event_problem,
    problems,
    public_message,
)
from services.api.routes.params import DirectRoute, NoIdempotencyKey, parameters_of, path_errors
from services.api.state import BEARER, ApiState, BoardDep, Server, State, get_board, opened
from services.api.strict_json import StrictJsonRoute, refuse_non_json_numbers, validated
from services.api.strict_query import query_errors
from services.api.write import limits
from services.api.write.models import ScoreIn, ScoreOut
from services.api.write.submit import (
    Call,
    answer,
    prepare,
    resolve_event_id,
    submit_many,
    write_one,
)
from shared.boards import Board
from shared.events import EVENT_ID_PATTERN

router = APIRouter(prefix="/v1/boards/{board_id}", tags=["scores"], route_class=StrictJsonRoute)

SCORES = Counter(
    "ladder_api_scores_total",
    "Score events answered: accepted, duplicate, or rejected (refused, on its own or with its "
    "request, once the credential and the board are judged)",
    ["outcome"],
)
WRITE_SECONDS = Histogram(
    "ladder_api_score_write_seconds",
    "Time of the atomic score write",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
# The single POST's outcomes, looked up once rather than by label on every request.
_ACCEPTED, _DUPLICATE = SCORES.labels("accepted"), SCORES.labels("duplicate")
_REJECTED = SCORES.labels("rejected")


# How a submission may be refused as a whole (docs/api.md sections 1, 4 and 9a).
# A score write's 503 (with Retry-After) says its outcome is not settled: a retry with the same
# event_id is answered as its duplicate if it was stored (services/api/write/durable.py).
WRITE_UNAVAILABLE = (
    "Redis is down, the outbox is full, the user's erasure is pending (nothing written), or "
    "(LADDER_REDIS_WAIT_REPLICAS) fewer Redis replicas than asked acknowledged the write in "
    "time; retry with the same event_id after Retry-After"
)
REFUSALS = problems(400, 401, 403, 404, 413, 422, 429, 503, said={503: WRITE_UNAVAILABLE})


# The single-score POST is the hottest route: it reads its path, credential, header and body
# itself instead of through FastAPI's dependency and body machinery, which cost a quarter of a
# write's CPU in the API (docs/architecture.md, "Performance"). The OpenAPI document still
# describes them, from the same models and patterns, through ``openapi_extra``.
_IDEMPOTENCY_KEY = re.compile(EVENT_ID_PATTERN)
_SCORE_OPENAPI: dict[str, Any] = {
    "parameters": [
        *parameters_of(("board_id",)),
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "The event's id, if not in the body (the same if in both)",
            "schema": {"type": "string", "pattern": EVENT_ID_PATTERN, "title": "Idempotency-Key"},
        },
    ],
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ScoreIn.model_json_schema()}},
    },
    "security": [{BEARER.scheme_name: []}],
}


async def _score_of(request: Request) -> tuple[ScoreIn, str | None]:
    """The body as a :class:`ScoreIn` and the ``Idempotency-Key`` header, or one 422 (400 for
    a body that is not JSON) naming every error of both, as FastAPI would."""
    errors: list[dict[str, Any]] = []
    key = request.headers.get("idempotency-key")
    if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
        errors.append(
            {
                "type": "string_pattern_mismatch",
                "loc": ("header", "Idempotency-Key"),
                "msg": f"String should match pattern '{EVENT_ID_PATTERN}'",
                "input": key,
            }
        )
    raw = await request.body()
    score = None
    if not raw:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required"})
    else:
        refuse_non_json_numbers(raw)
        try:
            score = validated(ScoreIn, raw)
        except ValidationError as exc:
            errors += [
                {**e, "loc": ("body", *e["loc"])}
                for e in exc.errors(include_url=False, include_context=False)
            ]
    # It declares no query parameter: any is refused (strict_query.py).
    errors += query_errors(request)
    if errors or score is None:
        raise RequestValidationError(errors)
    return score, key


async def post_score(request: Request) -> Response:
    """Submit one score; answers with the user's regional score and rank in every period.

    A server key may submit for any user; a player token only for itself, without a
    ``team_id``, and only on a board with ``player_writes`` (which declares its regions). An
    event naming a region the board does not declare answers 422. Repeating an accepted
    ``event_id`` with the same body answers the first result with ``duplicate: true``.
    """
    state: ApiState = request.state.ladder
    # The credential first (401), before the path, the board and the body are looked at: who
    # may not write learns nothing of boards or of what a valid body is.
    credential = bearer(request.headers.get("authorization"))
    caller = authenticate(credential, state.settings)
    if caller.kind == "anonymous":
        raise Unauthorized("Submitting scores needs a server key or a player token.")
    opened(state)
    # The path's board id checked here, as FastAPI would have before the handler: a parameter of
    # the route made FastAPI solve it through its dependency machinery on every request.
    errors = path_errors(request, "board_id")
    if errors:
        raise RequestValidationError(errors)
    board = await get_board(request.path_params["board_id"], state)
    if not caller.is_server and not board.takes_player_writes:
        raise Forbidden(
            "Players may not submit scores to this board."
            if not board.player_writes
            else "Players may submit scores to this board once it declares its regions."
        )
    try:
        result = await _write_score(request, state, caller, credential, board)
    except Exception:
        # Refused (its body, its conflict, a limit, an outage): counted as a batch's refused
        # events are, so that the counter holds every submission's outcome.
        _REJECTED.inc()
        raise
    (_DUPLICATE if result["duplicate"] else _ACCEPTED).inc()
    return json_answer(result)


async def _write_score(
    request: Request, state: ApiState, caller: Principal, credential: str | None, board: Board
) -> dict[str, Any]:
    """The single POST's event, validated and written once its credential and board are judged:
    its answer, or a refusal raised."""
    score, idempotency_key = await _score_of(request)
    if not caller.is_server:
        if caller.user_id != score.user_id:
            raise Forbidden("A player token may submit only its own scores.")
        if score.team_id is not None:
            raise Forbidden("A player token may not name a team: teams come from game servers.")
    await state.erasing.check(score.user_id)
    event_id = resolve_event_id(score, idempotency_key)
    quota = limits.quota(state.keys, state.settings, board.board_id, caller, credential or "")
    with WRITE_SECONDS.time():
        call = await prepare(
            state.redis, state.keys, state.settings, board, score, event_id, datetime.now(UTC)
        )
        if call.known is None:
            # In one round trip with the other single writes of this process (write/group.py).
            status, payload = await write_one(state.writes.write, call, quota)
            result = answer(status, payload, call)
            state.relay.wake(board.board_id)
        else:
            result = call.known
        if result["duplicate"]:
            # Its first write may be on no replica yet (write/durable.py).
            await state.writes.durability.confirm(state.redis, state.keys, board.board_id)
    return result


router.add_api_route(
    "/scores",
    post_score,
    methods=["POST"],
    response_model=ScoreOut,
    responses={
        **REFUSALS,
        **problems(409, said={409: "The event_id was accepted with another body"}),
    },
    openapi_extra=_SCORE_OPENAPI,
    route_class_override=DirectRoute,
)


MAX_BATCH = 1000


EVENT_ITEM = (
    "A score event, an object shaped as the single score POST's body; anything else is "
    "refused in its own result"
)


class BatchIn(BaseModel):
    """Each event is validated on its own: one bad event does not refuse the others."""

    model_config = ConfigDict(extra="forbid")

    # Any JSON value, in the document too: an event that is not an object is refused on its own
    # (its result a 422 problem), as any other invalid event is, not the whole batch.
    events: list[Annotated[Any, WithJsonSchema({"description": EVENT_ITEM})]] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="1 to 1000 score events, each shaped as the single score POST",
    )


class BatchError(BaseModel):
    event_id: str | None
    error: EventProblem = Field(description="A problem (RFC 9457) for this event alone")


class BatchOut(BaseModel):
    results: list[ScoreOut | BatchError]


def _validation_problem(exc: ValidationError) -> dict[str, Any]:
    body = Invalid("The event failed validation.").body()
    body["errors"] = [
        {"loc": list(e["loc"]), "msg": public_message(e), "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]
    return body


def _locate_in_batch(results: list[dict[str, Any] | None]) -> None:
    """Name each refused event's fields where they are in the batch's body: ``["body",
    "events", i, ...]``, as every 422's ``loc`` starts with where the field was sent (docs/api.md
    section 1). An event is validated as the single POST's body would be, so its errors come
    with the single POST's ``["body", ...]`` or, from the schema, with no place at all."""
    for i, result in enumerate(results):
        problem = result.get("error") if result else None
        if result is None or problem is None or "errors" not in problem:
            continue
        located = []
        for error in problem["errors"]:
            loc = list(error["loc"])
            located.append({**error, "loc": ["body", "events", i, *loc[loc[:1] == ["body"] :]]})
        result["error"] = {**problem, "errors": located}


def _answered_early(results: list[dict[str, Any] | None]) -> bool:
    """Whether an event of the batch was answered before the write: a retry's first answer, a
    409 for another body, a refusal while its user is erased. A client learns these even with the
    buckets empty (docs/api.md section 9a); only a 422 of its own input is no such answer."""
    return any(r is not None and r.get("error", {}).get("status") != 422 for r in results)


def _repeats_conflict(events: list[Any], results: list[dict[str, Any] | None]) -> None:
    """Answer 409, in place of its 422, an invalid event whose user and ``event_id`` an earlier
    event of the batch was accepted with.

    Every event is validated before any is written, and the validation finds a repeat's first
    body in its stored record only: the first of the batch is not stored yet then. A repeat that
    is valid reaches the write, which answers it (a duplicate, or 409 with another body); an
    invalid one has another body than the accepted first (whose body was valid), so it is 409,
    whatever is wrong with it (docs/api.md section 4, the batch)."""
    accepted: set[tuple[str, str]] = set()
    for i, (raw, result) in enumerate(zip(events, results, strict=True)):
        user_id = raw.get("user_id") if isinstance(raw, dict) else None
        event_id = raw.get("event_id") if isinstance(raw, dict) else None
        if not (isinstance(user_id, str) and isinstance(event_id, str)) or result is None:
            continue
        if "error" not in result:
            accepted.add((user_id, event_id))
        elif result["error"]["status"] == 422 and (user_id, event_id) in accepted:
            conflict = Conflict(
                f"event_id {event_id!r} was already accepted with a different body."
            )
            results[i] = {"event_id": event_id, "error": conflict.body()}


def _count(results: list[dict[str, Any] | None]) -> None:
    """Each event of a batch in the score metrics by its outcome."""
    for result in results:
        assert result is not None
        outcome = (
            "rejected"
            if "error" in result
            else ("duplicate" if result["duplicate"] else "accepted")
        )
        SCORES.labels(outcome).inc()


@router.post("/scores/batch", response_model=BatchOut, responses=REFUSALS)
async def post_batch(
    caller: Server,
    board: BoardDep,
    _: NoIdempotencyKey,
    batch: BatchIn,
    request: Request,
    state: State,
) -> Response:
    """Submit up to 1000 scores (server key): every valid one in a single Redis round trip.

    ``results`` holds one entry per event, in order: the single-event answer, or
    ``{"event_id", "error": {problem}}`` for an event refused on its own (validation, value
    bounds, lateness, a reused ``event_id`` with another body, its user or the credential over
    the rate limit, a region the board does not declare). A batch of which the credential's
    limit let no event through answers 429 as a whole.
    """
    results: list[dict[str, Any] | None] = [None] * len(batch.events)
    scores: dict[int, ScoreIn] = {}
    for i, raw in enumerate(batch.events):
        try:
            scores[i] = ScoreIn.model_validate(raw)
        except ValidationError as exc:
            event_id = raw.get("event_id") if isinstance(raw, dict) else None
            results[i] = {
                "event_id": event_id if isinstance(event_id, str) else None,
                "error": _validation_problem(exc),
            }
    credential = bearer(request.headers.get("authorization")) or ""
    quota = limits.quota(state.keys, state.settings, board.board_id, caller, credential)
    now = datetime.now(UTC)
    calls: dict[int, Call] = {}
    erasing = await state.erasing.erasing({s.user_id for s in scores.values()})
    for i, score in scores.items():
        if score.user_id in erasing:
            refused = event_problem(refusal(score.user_id))
            results[i] = {"event_id": score.event_id, "error": refused}
            continue
        event_id = score.event_id or uuid.uuid4().hex
        try:
            call = await prepare(
                state.redis, state.keys, state.settings, board, score, event_id, now
            )
        except Problem as problem:
            results[i] = {"event_id": event_id, "error": event_problem(problem)}
            continue
        if call.known is not None:
            results[i] = call.known
        else:
            calls[i] = call
    with WRITE_SECONDS.time():
        replies = await submit_many(
            state.redis, list(calls.values()), quota, state.writes.durability
        )
        if any(r is not None and r.get("duplicate") for r in results) or any(
            status == "duplicate" for status, _ in replies
        ):
            # Their first writes may be on no replica yet (write/durable.py).
            await state.writes.durability.confirm(state.redis, state.keys, board.board_id)
    if (
        replies
        and all(r == "limited" and p.startswith("credential ") for r, p in replies)
        and not _answered_early(results)
    ):
        # The credential was over its limit for the whole batch, nothing was written, and no
        # event has an answer the client needs whatever the buckets hold. Its wait is the
        # longest of its events' (a user's bucket may take longer than the credential's).
        _REJECTED.inc(len(results))
        raise limits.refusal(limits.longest(payload for _, payload in replies), "")
    for (i, call), (status, payload) in zip(calls.items(), replies, strict=True):
        try:
            results[i] = answer(status, payload, call)
        except Problem as problem:
            results[i] = {"event_id": call.event_id, "error": event_problem(problem)}
    _repeats_conflict(batch.events, results)
    _locate_in_batch(results)
    _count(results)
    if calls:
        state.relay.wake(board.board_id)
    return json_answer({"results": results})
