"""The dashboard (docs/api.md section 10): one static page at ``GET /``, its scripts and style.

The page needs no build step and nothing from outside: plain HTML, CSS and JavaScript served
from ``services/api/static``. It carries no credential; it reads what public reads allow over
REST and the WebSocket (see ``docs/dashboard.md``).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "static"

# The page loads only its own script and style and talks only to its own origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter(tags=["dashboard"])


@router.get(
    "/",
    response_class=HTMLResponse,
    summary="The dashboard",
    responses={200: {"description": "The dashboard page", "content": {"text/html": {}}}},
)
async def dashboard() -> FileResponse:
    """A live web page of the boards: global top players, top teams, hot streaks (10 s and
    60 s), team MVPs, each region's top and the recent activity. It reads the current state over
    REST when it opens, then follows the WebSocket's pushes. `?board=` and `?period=` choose
    what it shows (the default board is `arena`, the simulation's, else the first)."""
    return FileResponse(
        STATIC / "index.html", media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS
    )


@router.head("/", include_in_schema=False)
async def dashboard_head() -> FileResponse:
    """The page's headers (a HEAD: the file response sends no body)."""
    return await dashboard()


def install(app: FastAPI) -> None:
    """The page's route and its static files (``/static``)."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
