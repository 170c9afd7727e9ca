"""What the API tests share: the test's own MySQL database, opened as the API opens it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import open_engine
from shared.settings import LadderSettings


@pytest.fixture
async def db(settings: LadderSettings, mysql_database: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the test's own migrated database."""
    async with open_engine(settings.mysql_url) as engine:
        yield engine
