"""Nothing of a deleted board stays in a relay (shared/relaying.py, services/api/relay/outbox.py):
besides its gauges (set to 0: tests/aggregator/test_period_relay_turns.py), what the relay kept
of it, its group made, its reads settled and its unroutable messages' backoff, is forgotten at
the relay's next look at the board definitions."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from services.api.relay.outbox import Relay
from shared.boards import Board, BoardCatalog
from shared.keys import Keys
from shared.settings import LadderSettings


async def test_the_outbox_relay_forgets_a_deleted_board(
    redis: Redis, keys: Keys, settings: LadderSettings, test_id: str
) -> None:
    gone, kept = f"gone-{test_id}".lower(), f"kept-{test_id}".lower()
    catalog = BoardCatalog(redis, keys)
    relay = Relay(redis, keys, catalog, settings)
    for board_id in (gone, kept):
        await catalog.put(Board(board_id=board_id))
        # An outbox read empty: its group made, its reads settled.
        entry = await redis.xadd(keys.outbox(board_id), {"e": "0"})
        await redis.xdel(keys.outbox(board_id), entry)
        assert await relay._relay_board(board_id, False) == 0
    # Its messages came back unroutable: published again after a backoff.
    relay._retry_at[gone], relay._backoff[gone] = 0.0, 1.0
    assert keys.outbox(gone) in relay._settled and keys.outbox(gone) in relay._groups

    await catalog.remove(gone)
    await redis.unlink(keys.outbox(gone))
    stop = asyncio.Event()
    pump = asyncio.create_task(relay._pump(stop))
    await asyncio.sleep(0.2)
    stop.set()
    relay.wake(kept)
    await asyncio.wait_for(pump, 5)

    assert relay._settled == {keys.outbox(kept)} and relay._groups == {keys.outbox(kept)}
    assert gone not in relay._retry_at and gone not in relay._backoff
