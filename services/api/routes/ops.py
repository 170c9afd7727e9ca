"""Operations (docs/api.md section 10): an API process's ``/healthz``, ``/readyz`` and
``/metrics``."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import text

from services.api import errors
from services.api.relay.outbox import unroutable_boards
from services.api.state import ApiState
from services.api.strict_query import StrictQueryRoute
from shared.library import check_library
from shared.ops import metrics_response, readiness_response, run_checks

router = APIRouter(tags=["operations"], route_class=StrictQueryRoute)


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    dependencies: dict[str, Literal["up", "down"]] = Field(
        description="redis, broker, mysql, pubsub and routing, each up or down"
    )
    reasons: dict[str, str] = Field(
        description="why a dependency is down, where that is known: the error of its check "
        "(redis, mysql), the relay's last connection error or the topology the broker refuses "
        "(broker), and while the broker returns the relay's messages unroutable (routing) which "
        "boards' events the outbox keeps"
    )


@router.get("/healthz", response_model=Health, responses=errors.problems(422))
async def healthz() -> dict[str, str]:
    """Alive; checks no dependency."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={
        **errors.problems(422),
        503: {
            "model": Readiness,
            "description": "Redis is down, or not open yet at start (with Retry-After)",
            "headers": errors.PROBLEMS[503]["headers"],
        },
    },
)
async def readyz(request: Request) -> JSONResponse:
    """Each dependency and its state; 503 only while Redis is down, or not open yet at start.
    With the broker down, or returning the relay's messages unroutable (routing down), the API
    keeps accepting scores into the outbox."""
    # The state as it is, open or not: this answer is for a process that is starting as well.
    state: ApiState = request.state.ladder
    reasons: dict[str, str] = {}

    async def redis_up() -> bool:
        if not state.opened.is_set():
            reasons["redis"] = state.waiting
            return False
        if not await state.redis.ping():
            return False
        # Every score write and read calls the library: the API cannot work without it.
        await check_library(state.redis, state.settings.redis_cluster)
        return True

    async def broker_up() -> bool:
        if state.relay.ready:
            return True
        reasons["broker"] = state.relay.last_error or "the relay is not connected (yet)"
        return False

    async def mysql_up() -> bool:
        async with state.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    async def pubsub_up() -> bool:
        return state.hub.connected

    async def routing_up() -> bool:
        # Every API process's relay writes what the broker returns where any of them reads it.
        kept = await unroutable_boards(state.redis, state.keys)
        if kept:
            reasons["routing"] = "; ".join(r.describe(b) for b, r in sorted(kept.items()))
        return not kept

    checks = {
        "redis": redis_up,
        "broker": broker_up,
        "mysql": mysql_up,
        "pubsub": pubsub_up,
        "routing": routing_up,
    }
    states = await run_checks(checks, reasons=reasons)
    return readiness_response(states, required={"redis"}, reasons=reasons)


@router.get("/metrics", response_class=PlainTextResponse, responses=errors.problems(422))
async def metrics(_: Request) -> Response:
    """Prometheus text format."""
    return metrics_response()


# A server that answers GET answers HEAD (RFC 9110, section 9.1): uptime monitors and `curl -I`
# probe with it, as they may the consumers' ops endpoints (Starlette answers HEAD there).
def _headers_only(answer: Response) -> Response:
    return Response(status_code=answer.status_code, headers=dict(answer.headers))


@router.head("/healthz", include_in_schema=False)
async def healthz_head() -> Response:
    return _headers_only(JSONResponse(await healthz()))


@router.head("/readyz", include_in_schema=False)
async def readyz_head(request: Request) -> Response:
    return _headers_only(await readyz(request))


@router.head("/metrics", include_in_schema=False)
async def metrics_head(request: Request) -> Response:
    return _headers_only(await metrics(request))
