"""Public reads (docs/api.md section 2): without them, a read needs a credential."""

from __future__ import annotations

import pytest

from services.api.app import create_app
from shared.settings import LadderSettings
from tests.api.helpers import LEADERBOARD, assert_problem, post, score
from tests.helpers import SERVER, api_client, player

# PyJWT warns on every sign and verify with a key under 32 bytes; the contract's development
# secret, which these tests use as the API does, is 14.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")


async def test_without_public_reads_a_read_needs_a_credential(quiet: LadderSettings) -> None:
    settings = quiet.model_copy(update={"public_reads": False})
    async with api_client(settings) as client:
        await post(client, score(value=10))
        anonymous = [
            await client.get(LEADERBOARD, params={"scope": "region:eu"}),
            await client.get("/v1/boards"),
            await client.get("/v1/boards/main/users/u-1", params={"scope": "region:eu"}),
        ]
        as_player = await client.get(
            LEADERBOARD, params={"scope": "region:eu"}, headers=player("u-9")
        )
        as_server = await client.get(LEADERBOARD, params={"scope": "region:eu"}, headers=SERVER)

    for response in anonymous:
        assert_problem(response, 401)
    assert as_player.status_code == 200
    assert [e["user_id"] for e in as_player.json()["entries"]] == ["u-1"]
    assert as_server.status_code == 200


def test_without_public_reads_the_document_lists_no_open_operation(quiet: LadderSettings) -> None:
    def open_operations(settings: LadderSettings) -> list[str]:
        document = create_app(settings).openapi()
        return [
            f"{method.upper()} {path}"
            for path, operations in document["paths"].items()
            for method, operation in operations.items()
            if {} in operation.get("security", [])
        ]

    public = open_operations(quiet)
    assert "GET /v1/boards/{board_id}/leaderboard" in public
    assert open_operations(quiet.model_copy(update={"public_reads": False})) == []
