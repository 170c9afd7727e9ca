"""A board's live views as the API answers them from what the aggregator stored: the hot read
(``GET /v1/boards/{id}/hot``) and a new WebSocket subscriber's first message of a hot or MVP
topic say the same (the rules: shared/live_maths.py).

A stored view was computed at the aggregator's last tick, and a user hidden since is left out of
it here (docs/api.md section 8b), the others' ranks closed up, until the next tick stores it
without the user. The board's hidden set is read in the same round trip as the view (both are
the board's keys): on a board that hides nobody it is an empty reply, and the view is served as
stored."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from shared.keys import Keys
from shared.live_maths import hot_current, without_hidden


async def current_hot(
    redis: Redis, keys: Keys, board_id: str, window: int
) -> dict[str, Any] | None:
    """The hot view of ``window`` seconds, its ``as_of`` moved to the aggregator's last pass
    where it holds no entry (``hot_current``), without the users hidden on the board; None when
    the aggregator has stored neither (no pass for two minutes). The pass time is read first,
    then the view: a view stored before that time is then read after it, so an empty view is
    never dated later than it holds."""
    quiet = await redis.get(keys.live_quiet())
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(keys.hot_view(board_id, window))
        pipe.smembers(keys.hidden(board_id))
        stored, hidden = await pipe.execute()
    if stored is None and quiet is None:
        return None
    view = hot_current(board_id, window, stored, quiet)
    if hidden:
        view["entries"] = without_hidden(view["entries"], hidden)
    return view


async def current_mvps(redis: Redis, keys: Keys, board_id: str, period: str) -> str | None:
    """The MVP view of the board's current ``period`` as the aggregator stored and pushed it
    (its JSON), without the users hidden on the board; None if none is stored."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(keys.mvp_view(board_id, period))
        pipe.smembers(keys.hidden(board_id))
        stored, hidden = await pipe.execute()
    if stored is None or not hidden:
        return None if stored is None else str(stored)
    view = orjson.loads(stored)
    view["entries"] = without_hidden(view["entries"], hidden)
    return orjson.dumps(view).decode()
