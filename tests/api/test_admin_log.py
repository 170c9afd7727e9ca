"""What an admin does is logged, with which key did it (docs/operations.md, "Logs"): the
definitions made and replaced (with the fields changed), users hidden and shown, erasures and
board deletions asked for. A key is named by its digest, never by itself, and an erasure's user
by its hash, as the erasure's own line names it."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from services.api.auth import key_id
from shared.erasure import user_hash
from shared.settings import DEV_ADMIN_KEY, LadderSettings
from tests.helpers import ADMIN, SERVER, api_client

pytestmark = pytest.mark.usefixtures("mysql_database")

ACTIONS = {
    "board created",
    "board replaced",
    "user hidden",
    "user shown",
    "erasure requested",
    "board deletion requested",
}


async def test_every_admin_action_is_logged_with_its_key(quiet: LadderSettings) -> None:
    board = {"periods": ["daily"], "regions": ["eu"]}
    with capture_logs() as logs:
        async with api_client(quiet) as client:
            made = await client.put("/v1/boards/cup", json=board, headers=ADMIN)
            assert made.status_code == 201, made.text
            changed = await client.put(
                "/v1/boards/cup", json={**board, "regions": ["eu", "na"]}, headers=ADMIN
            )
            assert changed.status_code == 200, changed.text
            for method in ("PUT", "DELETE"):
                moved = await client.request(
                    method, "/v1/boards/cup/users/u-1/hidden", headers=ADMIN
                )
                assert moved.status_code == 204, moved.text
            erased = await client.delete("/v1/users/u-2", headers=ADMIN)
            assert erased.status_code == 202, erased.text
            deleted = await client.delete("/v1/boards/cup", headers=ADMIN)
            assert deleted.status_code == 202, deleted.text
            # Refused: logged as nothing done.
            refused = await client.put("/v1/boards/cup2", json=board, headers=SERVER)
            assert refused.status_code == 403, refused.text
    trail = [e for e in logs if e["event"] in ACTIONS]
    assert sorted(e["event"] for e in trail) == sorted(ACTIONS)  # each once
    done = {e["event"]: e for e in trail}
    assert all(e["by"] == key_id(DEV_ADMIN_KEY) for e in done.values())
    assert done["board replaced"]["changed"] == ["regions"]
    assert done["user hidden"]["user_id"] == "u-1"
    assert done["board deletion requested"]["purge"] is False
    erasure: dict[str, Any] = done["erasure requested"]
    assert erasure["user_hash"] == user_hash("u-2", quiet.effective_jwt_secret)
    assert "u-2" not in str(erasure)
    assert DEV_ADMIN_KEY not in str(logs)
    assert not [e for e in logs if e.get("board_id") == "cup2"]
