"""The API: REST and WebSocket clients, the atomic write, the outbox relay."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Literal

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import text

from services.api import errors
from services.api.hub import Hub
from services.api.limits import BodyLimit, JsonBodies
from services.api.relay import Relay
from services.api.restore import Restorer
from services.api.routes import (
    activity,
    badges,
    boards,
    dashboard,
    friends,
    reads,
    scores,
    snapshots,
)
from services.api.routes import live as live_views
from services.api.state import ApiState, State
from services.api.ws import router as ws_router
from shared.boards import BoardCatalog
from shared.db import open_engine
from shared.keys import Keys
from shared.ops import metrics_response, readiness_response, run_checks
from shared.redis import open_redis
from shared.settings import LadderSettings

log = structlog.get_logger(__name__)

DESCRIPTION = """
Ladder keeps game leaderboards live. Game servers post scores; players read global, regional
and per-period boards and their own rank, and get pushes over the WebSocket at `/v1/ws`.

Credentials: `Authorization: Bearer <server key | admin key | player JWT>`. Errors are
`application/problem+json`.
"""


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    dependencies: dict[str, Literal["up", "down"]] = Field(
        description="redis, broker, mysql and pubsub, each up or down"
    )


@contextlib.asynccontextmanager
async def _background(
    coro: Coroutine[Any, Any, None], stop: Callable[[], None], grace: float
) -> AsyncIterator[None]:
    """Run ``coro`` for the block; on the way out ask it to ``stop`` and give it ``grace``
    seconds to finish (closing its own connections) before it is cancelled."""
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), grace)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def create_app(settings: LadderSettings | None = None) -> FastAPI:
    settings = settings or LadderSettings()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, ApiState]]:
        if used := settings.uses_dev_defaults:
            log.warning("using development credentials", defaults=used, env=settings.env)
        keys = Keys(settings.key_prefix)
        async with (
            open_redis(settings.redis_url, load_functions=True) as redis,
            open_engine(settings.mysql_url) as engine,
        ):
            catalog = BoardCatalog(redis, keys)
            # Definitions and friendships back from MySQL, their source of truth, into a Redis
            # that may have lost them; retried in the background if MySQL is away now.
            restorer = Restorer(engine, redis, keys, catalog)
            await restorer.attempt()
            await catalog.ensure_defaults()
            relay = Relay(redis, keys, catalog, settings)
            hub = Hub(settings.redis_url, f"ladder-hub-{settings.key_prefix}")
            state = ApiState(settings, keys, redis, catalog, engine, relay, hub)
            # The relay gets the grace period to hand what is in the outbox to the broker.
            async with (
                _background(hub.run(), hub.stop, 5.0),
                _background(relay.run(), relay.stop, settings.shutdown_grace_seconds),
                _background(restorer.retry(), restorer.stop, 1.0),
            ):
                log.info("api ready", port=settings.api_port)
                yield {"ladder": state}
                # services.api.server sets it before any connection is closed; under another
                # server it comes after that server has closed the sockets itself.
                state.shutting_down.set()

    app = FastAPI(
        title="Ladder",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        # Bodies are JSON; see limits.JsonBodies for bodies labelled otherwise.
        strict_content_type=False,
    )
    errors.install(app)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.include_router(scores.router)
    app.include_router(reads.router)
    app.include_router(activity.router)
    app.include_router(badges.router)
    app.include_router(boards.router)
    app.include_router(friends.router)
    app.include_router(snapshots.router)
    app.include_router(live_views.router)
    app.include_router(ws_router)
    dashboard.install(app)

    @app.get("/healthz", tags=["operations"], response_model=Health)
    async def healthz() -> dict[str, str]:
        """Alive; checks no dependency."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["operations"],
        response_model=Readiness,
        responses={
            503: {
                "model": Readiness,
                "description": "Redis is down (with Retry-After)",
                "headers": errors.PROBLEMS[503]["headers"],
            }
        },
    )
    async def readyz(state: State) -> JSONResponse:
        """Each dependency and its state; 503 only while Redis is down. With the broker down
        the API keeps accepting scores into the outbox."""

        async def redis_up() -> bool:
            return bool(await state.redis.ping())

        async def broker_up() -> bool:
            return state.relay.ready

        async def mysql_up() -> bool:
            async with state.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return True

        async def pubsub_up() -> bool:
            return state.hub.connected

        checks = {"redis": redis_up, "broker": broker_up, "mysql": mysql_up, "pubsub": pubsub_up}
        return readiness_response(await run_checks(checks), required={"redis"})

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    async def metrics(_: Request) -> Response:
        """Prometheus text format."""
        return metrics_response()

    return app
