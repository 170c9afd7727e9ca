"""The consumers' operations routes (shared/ops.py, on ports 9101 to 9103) answer what they do
not take as the API's routes do (docs/api.md section 1): a query parameter is a 422, an unknown
path a 404 and another method a 405, each a problem (RFC 9457). They answered 200 to
``/healthz?x=1`` and a plain-text 404."""

from __future__ import annotations

import httpx

from shared.ops import ops_app

PROBLEM = "application/problem+json"


async def redis_up() -> bool:
    return True


async def test_the_operations_routes_refuse_what_they_do_not_take_with_problems() -> None:
    app = ops_app({"redis": redis_up}, {"redis"})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ops") as client:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status_code == 200, path
            typo = await client.get(path, params=[("verbose", "1"), ("verbose", "2")])
            assert typo.status_code == 422, path
            assert typo.headers["content-type"] == PROBLEM
            assert typo.json()["errors"] == [
                {
                    "loc": ["query", "verbose"],
                    "msg": "Extra inputs are not permitted",
                    "type": "extra_forbidden",
                }
            ]
        unknown = await client.get("/no/such/path")
        moved = await client.post("/healthz")
    assert (unknown.status_code, unknown.headers["content-type"]) == (404, PROBLEM)
    assert unknown.json()["type"].endswith("/not-found")
    assert (moved.status_code, moved.headers["content-type"]) == (405, PROBLEM)
    assert moved.json()["type"].endswith("/method-not-allowed")
    assert "GET" in moved.headers["allow"]
