"""``/healthz``, ``/readyz`` and ``/metrics`` for the consumer services.

Each consumer serves these on its own port (aggregator 9101, history 9102, notifier 9103) with a
small Starlette app run by uvicorn inside the service's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared.failures import short_reason
from shared.problems import PROBLEM, problem_body
from shared.settings import multiprocess_metrics_dir

Check = Callable[[], Awaitable[bool]]
Reasons = Callable[[], Mapping[str, str]]


async def run_checks(
    checks: Mapping[str, Check], wait: float = 1.0, reasons: dict[str, str] | None = None
) -> dict[str, str]:
    """``{dependency: "up" | "down"}``; a check that raises or times out is down, and says
    why in ``reasons`` (a short line, no address in it) where one is given."""

    async def one(name: str, check: Check) -> str:
        try:
            return "up" if await asyncio.wait_for(check(), wait) else "down"
        except TimeoutError:
            if reasons is not None:
                reasons.setdefault(name, f"no answer within {wait:g} s")
            return "down"
        except Exception as exc:
            if reasons is not None:
                reasons.setdefault(name, short_reason(exc))
            return "down"

    names = list(checks)
    states = await asyncio.gather(*(one(n, checks[n]) for n in names))
    return dict(zip(names, states, strict=True))


def readiness_response(
    states: dict[str, str], required: set[str], reasons: Mapping[str, str] | None = None
) -> JSONResponse:
    """The ``/readyz`` answer: 503 while a ``required`` dependency is down; ``reasons`` says
    why a dependency is down, where that is known."""
    ready = all(states[name] == "up" for name in required)
    body = {
        "status": "ready" if ready else "not ready",
        "dependencies": states,
        "reasons": dict(reasons or {}),
    }
    headers = {} if ready else {"Retry-After": "1"}
    return JSONResponse(body, status_code=200 if ready else 503, headers=headers)


def metrics_response() -> Response:
    # With several API workers (services/api/serving/workers.py) every process keeps its samples
    # in files under prometheus-client's multiprocess directory, and whichever answers sums them.
    directory = multiprocess_metrics_dir()
    if directory:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def ops_app(
    checks: Mapping[str, Check], required: set[str], reasons: Reasons | None = None
) -> Starlette:
    """The ops endpoints. ``/readyz``'s ``reasons``: why a check raised, else what ``reasons()``
    says about a dependency that is down (its last connection error, say), and what it says
    under a name that is no dependency (``handler``: the error a held batch is retried on)."""

    async def healthz(request: Request) -> JSONResponse:
        return _no_query(request) or JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        if refused := _no_query(request):
            return refused
        why: dict[str, str] = {}
        states = await run_checks(checks, reasons=why)
        for name, reason in (reasons() if reasons is not None else {}).items():
            if states.get(name, "down") == "down":
                why.setdefault(name, reason)
        return readiness_response(states, required, why)

    async def metrics(request: Request) -> Response:
        return _no_query(request) or metrics_response()

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ],
        exception_handlers={HTTPException: _http_problem},
    )


def _no_query(request: Request) -> JSONResponse | None:
    """422 for a query parameter, which none of these routes takes, as the API's routes answer
    one they do not take (docs/api.md section 1): a typo is told, not ignored."""
    if not request.query_params:
        return None
    body = problem_body(
        422, "Unprocessable content", "validation", "The request failed validation."
    )
    body["errors"] = [
        {"loc": ["query", name], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
        for name in dict.fromkeys(request.query_params.keys())
    ]
    return JSONResponse(body, status_code=422, media_type=PROBLEM)


async def _http_problem(_: Request, exc: Exception) -> Response:
    """A path or method these routes do not have, answered as a problem like the API's."""
    assert isinstance(exc, HTTPException)
    title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "Error")
    slug = title.lower().replace(" ", "-")
    body = problem_body(exc.status_code, title, slug, str(exc.detail))
    return JSONResponse(body, exc.status_code, headers=exc.headers, media_type=PROBLEM)


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM and SIGINT to the service that runs it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve_ops(
    host: str,
    port: int,
    checks: Mapping[str, Check],
    required: set[str],
    reasons: Reasons | None = None,
) -> AsyncIterator[None]:
    """Serve the ops endpoints in the background for the duration of the block."""
    config = uvicorn.Config(
        ops_app(checks, required, reasons),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
    )
    async with running(_QuietServer(config)):
        yield


@contextlib.asynccontextmanager
async def running(server: uvicorn.Server) -> AsyncIterator[None]:
    """Run ``server`` in this event loop for the duration of the block: the block starts once it
    listens (or raises what stopped it from starting), and ends once it has shut down."""
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        await task
