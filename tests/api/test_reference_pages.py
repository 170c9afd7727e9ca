"""``/docs`` and ``/redoc`` work with no internet: every script, style and icon they load is
served by the API itself (services/api/routes/reference.py)."""

from __future__ import annotations

import re

import pytest

from shared.settings import LadderSettings
from tests.helpers import api_client


@pytest.mark.parametrize(
    ("page", "reader"), [("/docs", "SwaggerUIBundle"), ("/redoc", "<redoc spec-url")]
)
async def test_a_reference_page_loads_only_from_the_api(
    quiet: LadderSettings, page: str, reader: str
) -> None:
    async with api_client(quiet) as client:
        html = (await client.get(page)).text
        loaded = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert loaded, html
        for url in loaded:
            assert url.startswith("/"), f"{page} loads {url} from elsewhere"
            asset = await client.get(url)
            assert asset.status_code == 200 and asset.content, url
        assert reader in html and "/openapi.json" in html
        # The reference reads OpenAPI 3.1, which the document is.
        assert (await client.get("/openapi.json")).json()["openapi"].startswith("3.1")
        bundle = (await client.get("/reference/swagger-ui-bundle.js")).text
        assert "oas/3.1" in bundle
