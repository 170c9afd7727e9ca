"""Stored events replayed onto a board's staging keys, through the write path's own ``submit()``
(``ladder_replay_v10``), so that the rebuilt keys are made by the very calls that made the live
ones."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from shared.boards import Board
from shared.db import from_db_time
from shared.functions import REPLAY_FUNCTION
from shared.keys import Keys, event_ref
from shared.settings import LadderSettings
from shared.submit import SubmitEvent, replay_keys, replayed_keys, submit_call

log = structlog.get_logger(__name__)


@dataclass
class Staged:
    """The live names of the keys staged so far, event counters apart (checked at the end)."""

    counters: set[str] = field(default_factory=set)
    others: set[str] = field(default_factory=set)
    # The journal's events' records (their live idempotency records): the finish clears their
    # derive-pending bits.
    records: set[str] = field(default_factory=set)

    def add(self, call_keys: Sequence[str]) -> None:
        """The keys a replay of one ``submit()`` call stages (not the write's own keys, for
        which a replay gets scratch keys)."""
        counters, others = replayed_keys(call_keys)
        self.counters.update(counters)
        self.others.update(others)


def replay_call(
    keys: Keys, settings: LadderSettings, board: Board, row: Any
) -> tuple[list[str], list[str | int]]:
    """The keys (live names) and arguments of ``submit()`` for one stored event (a row of
    :func:`services.rebuild.event_log.page`): what the API's write path built when the event was
    accepted. The metadata goes back as the very text the live write was given, which the event
    log keeps (NULL, for none, is ``None`` as it was)."""
    event = SubmitEvent(
        row.event_id,
        row.user_id,
        row.region,
        row.team_id,
        row.display_name,
        row.value,
        from_db_time(row.occurred_at),
        from_db_time(row.accepted_at),
        subscore=row.subscore,
        metadata=row.metadata,
    )
    # No body hash: the scratch idempotency answer is deleted at once; and the scratch outbox
    # is empty at every call.
    return submit_call(
        keys,
        board,
        event,
        body_hash="",
        idempotency_ttl=settings.idempotency_ttl_seconds,
        outbox_max=1,
        feed_length=settings.feed_length,
    )


async def replay(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    board: Board,
    rows: Sequence[Any],
    staged: Staged,
) -> int:
    """Replay ``rows`` (stored events, in log order) onto staging in one round trip, noting the
    keys they staged in ``staged``. Returns how many the board refuses now."""
    bid = board.board_id
    async with redis.pipeline(transaction=False) as pipe:
        for row in rows:
            call_keys, args = replay_call(keys, settings, board, row)
            staged.add(call_keys)
            pipe.fcall(REPLAY_FUNCTION, len(call_keys), *replay_keys(keys, bid, call_keys), *args)
        statuses: list[Any] = await pipe.execute()
    refused = [s for s in statuses if s != "ok"]
    if refused:
        # An event accepted under other bounds or periods than the board has now.
        log.warning("events the board refuses now", board_id=bid, statuses=refused[:5])
    return len(refused)


def journaled_refs(entries: Iterable[Any], journal: Staged) -> set[str]:
    """The events of journal entries, each as ``shared.keys.event_ref`` names it: each entry a
    recorded ``submit()`` call whose fourth argument is the user and seventh the event's JSON
    without its closing brace. The calls' keys are added to ``journal``: the finish step
    replays them onto staging, and must be given each key."""
    calls = [orjson.loads(entry) for entry in entries]
    for call in calls:
        journal.add(call["keys"])
        journal.records.add(call["keys"][0])
    return {
        event_ref(orjson.loads(call["args"][6] + "}")["event_id"], call["args"][3])
        for call in calls
    }
