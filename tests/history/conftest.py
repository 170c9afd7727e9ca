"""What the history tests share: the history database, opened as the history service opens it,
and a snapshotter of top 3 on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.snapshotter import Snapshotter
from shared.db import open_engine
from shared.keys import Keys
from shared.settings import LadderSettings


@pytest.fixture
async def db(settings: LadderSettings, mysql_database: str) -> AsyncIterator[AsyncEngine]:
    async with open_engine(settings.mysql_url, changed_rows=True) as engine:
        yield engine


@pytest.fixture
def snapshotter(redis: Redis, keys: Keys, db: AsyncEngine) -> Snapshotter:
    return Snapshotter(redis, keys, db, size=3)
