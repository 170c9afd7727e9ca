"""The API as an ASGI application: :func:`create_app` and the lifespan that owns its
connections and background tasks (the outbox relay, the Pub/Sub hub, the start-up restore)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import structlog
from fastapi import FastAPI
from starlette.types import ASGIApp

from services.api import errors
from services.api.auth import CredentialFirst
from services.api.bodies import BodyLimit, JsonBodies
from services.api.direct_reads import DirectReads
from services.api.eraser import Eraser
from services.api.erasing import ErasingUsers
from services.api.push.admission import SocketSlots
from services.api.push.hub import Hub
from services.api.push.ws import router as ws_router
from services.api.relay.outbox import Relay
from services.api.restorer import Restorer
from services.api.routes import (
    activity,
    badges,
    dashboard,
    definitions,
    erasure,
    friends,
    moderation,
    ops,
    reads,
    reference,
    scores,
    snapshots,
)
from services.api.routes import live as live_views
from services.api.routes.params import DirectPaths
from services.api.state import ApiState, document_private_reads
from services.api.write.durable import Durability
from services.api.write.group import group_commit
from shared.boards import BoardCatalog
from shared.db import open_engine
from shared.failures import short_reason
from shared.keys import Keys
from shared.redis import connect, redis_client
from shared.redis_cluster import LadderCluster, seed_nodes
from shared.settings import LadderSettings

log = structlog.get_logger(__name__)

DESCRIPTION = """
Ladder keeps game leaderboards live. Game servers post scores; players read global, regional
and per-period boards and their own rank, and get pushes over the WebSocket at `/v1/ws`.

Credentials: `Authorization: Bearer <server key | admin key | player JWT>`. Errors are
`application/problem+json`. A route takes only the query parameters listed for it, each once:
another, or one given twice, is a 422 naming it.
"""

Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[dict[str, ApiState]]]


@contextlib.asynccontextmanager
async def _background(
    coro: Coroutine[Any, Any, None],
    stop: Callable[[], None],
    grace: float,
    after: asyncio.Event,
) -> AsyncIterator[None]:
    """Run ``coro`` for the block, once ``after`` is set (Redis open); on the way out ask it to
    ``stop`` and give it ``grace`` seconds to finish (closing its own connections) before it is
    cancelled. One that had not begun is dropped at once."""

    async def once_open() -> None:
        await after.wait()
        await coro

    task = asyncio.create_task(once_open())
    try:
        yield
    finally:
        if after.is_set():
            stop()
            try:
                await asyncio.wait_for(asyncio.shield(task), grace)
            except TimeoutError:
                task.cancel()
        else:
            task.cancel()
            coro.close()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# How long the lifespan waits for Redis's first answer, or refusal, before it serves without it.
FIRST_TRY_SECONDS = 5.0


async def _open(state: ApiState, restorer: Restorer, tried: asyncio.Event) -> None:
    """Open what the API needs of Redis, waiting for it to answer, then set ``state.opened``:
    the function library loaded, what Redis lost restored from MySQL (retried in the background
    if MySQL is away now), board ``main`` defined. ``tried`` is set once that is done or the
    first try has failed. A failure (a database the Redis server has not, a library it
    refuses) is ``state.failure``, which stops the server."""

    def failed(error: BaseException) -> None:
        state.waiting = short_reason(error)
        tried.set()

    state.waiting = "connecting"
    try:
        await connect(state.redis, load_functions=True, wait=True, waiting=failed)
        await restorer.attempt()
        await state.catalog.ensure_defaults()
    except Exception as exc:
        if tried.is_set():
            # The API serves already: the lifespan, which raises a failure of the first try,
            # cannot raise this one.
            log.exception("api failed to open Redis; stopping")
        state.waiting = short_reason(exc)
        state.failure = exc
        return
    finally:
        tried.set()
    state.opened.set()
    log.info("api ready", port=state.settings.api_port)


@contextlib.asynccontextmanager
async def _opening(state: ApiState, restorer: Restorer) -> AsyncIterator[None]:
    """Redis opened for ``state`` in the background (:func:`_open`), until the block ends. The
    block starts once it is open, as a lifespan that waited for it did, or, if Redis does not
    answer at once, while it is waited for: ``/healthz`` and ``/readyz`` answer meanwhile.
    A failure of the first try is raised (the server does not start)."""
    tried = asyncio.Event()
    opening = asyncio.create_task(_open(state, restorer, tried))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tried.wait(), FIRST_TRY_SECONDS)
        if state.failure is not None:
            raise state.failure
        yield
    finally:
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await opening


def lifespan_of(settings: LadderSettings) -> Lifespan:
    """The lifespan of an API process: Redis and MySQL opened, what Redis lost restored, then
    the hub, the relay and the restore's retries in the background; all closed in reverse.
    A Redis that does not answer at start is waited for in the background while the API serves:
    ``/healthz`` and ``/readyz`` answer meanwhile, and requests that need Redis answer 503, as
    on an outage."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, ApiState]]:
        if used := settings.uses_dev_defaults:
            log.warning("using development credentials", defaults=used, env=settings.env)
        keys = Keys(settings.key_prefix)
        async with (
            redis_client(
                settings.redis_url, cluster=settings.redis_cluster, load_functions=True
            ) as redis,
            open_engine(settings.mysql_url) as engine,
        ):
            catalog = BoardCatalog(redis, keys)
            # Definitions and friendships back from MySQL, their source of truth, into a Redis
            # that may have lost them (or, friendships, hold some MySQL no longer has); retried
            # in the background if MySQL is away now, then the friend sets reconciled there.
            restorer = Restorer(engine, redis, keys, catalog, settings.friends_reconcile_seconds)
            relay = Relay(redis, keys, catalog, settings)
            nodes, hub_url = None, settings.redis_url
            if isinstance(redis, LadderCluster):
                hub_url = seed_nodes(settings.redis_url)[0]
                nodes = functools.partial(redis.node_urls, hub_url)
            hub = Hub(hub_url, f"ladder-hub-{settings.key_prefix}", nodes, settings.ws_send_queue)
            eraser = Eraser(engine, redis, keys, catalog, settings.future_tolerance_seconds)
            sockets = SocketSlots(settings.ws_max, settings.ws_max_per_ip, redis, keys)
            opened = asyncio.Event()
            # The relay gets the grace period to hand what is in the outbox to the broker; the
            # group commit, last in, is drained first, so that the relay sees its writes. Each
            # starts once Redis is open.
            async with (
                _background(hub.run(), hub.stop, 5.0, opened),
                _background(relay.run(), relay.stop, settings.shutdown_grace_seconds, opened),
                _background(restorer.retry(), restorer.stop, 1.0, opened),
                _background(eraser.run(), eraser.stop, 2.0, opened),
                _background(sockets.run(), sockets.stop, 1.0, opened),
                group_commit(
                    redis,
                    window=settings.write_group_ms / 1000,
                    most=settings.write_group_max,
                    durability=Durability.of(settings),
                ) as writes,
            ):
                erasing = ErasingUsers(redis, keys, settings.effective_jwt_secret)
                state = ApiState(
                    settings,
                    keys,
                    redis,
                    catalog,
                    engine,
                    relay,
                    hub,
                    writes,
                    sockets,
                    erasing,
                    opened=opened,
                )
                async with _opening(state, restorer):
                    yield {"ladder": state}
                # services.api.serving sets it before any connection is closed; under another
                # server it comes after that server has closed the sockets itself.
                state.shutting_down.set()

    return lifespan


def create_app(settings: LadderSettings | None = None) -> FastAPI:
    settings = settings or LadderSettings()
    app = FastAPI(
        title="Ladder",
        version="1.1.0",
        description=DESCRIPTION,
        lifespan=lifespan_of(settings),
        # Bodies are JSON; see bodies.JsonBodies for bodies labelled otherwise.
        strict_content_type=False,
        # FastAPI's own OpenTelemetry: off. Ladder's metrics are Prometheus' (/metrics), and
        # with it on, FastAPI looked up the global providers (reading the environment) on every
        # request, about 4% of a worker's CPU under single score POSTs.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # /docs and /redoc with their scripts served from here (routes/reference.py).
        docs_url=None,
        redoc_url=None,
    )
    errors.install(app)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    # Outermost: an anonymous request that needs a credential is refused before anything else.
    app.add_middleware(CredentialFirst, public_reads=settings.public_reads)
    app.include_router(scores.router)
    app.include_router(reads.router)
    app.include_router(activity.router)
    app.include_router(badges.router)
    app.include_router(definitions.router)
    app.include_router(friends.router)
    app.include_router(moderation.router)
    app.include_router(erasure.router)
    app.include_router(snapshots.router)
    app.include_router(live_views.router)
    app.include_router(ws_router)
    dashboard.install(app)
    reference.install(app)
    # Last, so that the OpenAPI document lists the operations endpoints after the rest.
    app.include_router(ops.router)
    activity.document_feed_length(app, settings.feed_length)
    # In the router's place, inside the middleware: the page and standing reads are handed to
    # their endpoints without the walk over every router (routes/params.py, DirectPaths).
    direct = DirectPaths(app.router.middleware_stack, reads.DIRECT_READS)
    app.router.middleware_stack = direct
    # And in front of the middleware, for a plain GET of theirs (services/api/direct_reads.py):
    # built with the stack, at the first request, with the app's exception handlers as they are.
    build = app.build_middleware_stack

    def build_with_direct_reads() -> ASGIApp:
        return DirectReads(build(), direct, app.exception_handlers, settings.public_reads)

    app.build_middleware_stack = build_with_direct_reads  # type: ignore[method-assign]
    if not settings.public_reads:
        document_private_reads(app)
    return app
