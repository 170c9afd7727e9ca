"""The API's reference pages: ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), both drawn from
``/openapi.json``.

FastAPI's own pages load their scripts and style from a CDN, and show nothing on a machine
without the internet. These load them from the API itself: the copies the ``fastapi-offline``
package ships (Swagger UI 5, which reads OpenAPI 3.1), served under ``/reference``.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/reference"


def install(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """``/docs``, ``/redoc`` and their assets; ``app`` made with ``docs_url=None`` and
    ``redoc_url=None``."""
    directory = str(files("fastapi_offline") / "static")
    app.mount(ASSETS, StaticFiles(directory=directory), name="reference")
    title = f"{app.title} {app.version}"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title}: API reference",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title}: API reference",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
