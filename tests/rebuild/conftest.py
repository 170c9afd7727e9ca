"""What the rebuild's tests share: the history database, opened as the rebuild opens it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import open_engine
from shared.settings import LadderSettings


@pytest.fixture
async def db(settings: LadderSettings, mysql_database: str) -> AsyncIterator[AsyncEngine]:
    async with open_engine(settings.mysql_url, changed_rows=True) as engine:
        yield engine
