"""A board's hot view as the API answers it: the read (``GET /v1/boards/{id}/hot``) and a new
WebSocket subscriber's first message say the same (the rules: shared/live_maths.py)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from shared.keys import Keys
from shared.live_maths import hot_current


async def current_hot(
    redis: Redis, keys: Keys, board_id: str, window: int
) -> dict[str, Any] | None:
    """The hot view of ``window`` seconds, its ``as_of`` moved to the aggregator's last pass
    where it holds no entry (``hot_current``); None when the aggregator has stored neither (no
    pass for two minutes). The pass time is read first, then the view: a view stored before
    that time is then read after it, so an empty view is never dated later than it holds."""
    quiet = await redis.get(keys.live_quiet())
    stored = await redis.get(keys.hot_view(board_id, window))
    if stored is None and quiet is None:
        return None
    return hot_current(board_id, window, stored, quiet)
