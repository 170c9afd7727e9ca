"""Stored events replayed onto a board's staging keys, through the write path's own ``submit()``
(``ladder_replay_v10``), so that the rebuilt keys are made by the very calls that made the live
ones."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from shared.boards import Board
from shared.db import from_db_time
from shared.events import parse_period_ids
from shared.functions import REPLAY_FUNCTION
from shared.keys import Keys, event_ref
from shared.periods import Period
from shared.settings import LadderSettings
from shared.submit import (
    FORMER_SEASON_TTL,
    SubmitEvent,
    period_call_keys,
    replay_keys,
    replayed_keys,
    stored_periods,
    submit_call,
)

# A season of a former schedule whose keys would expire within this many seconds of the replay
# is not put in place at all: its staging copies could lapse before the finish step.
FORMER_MARGIN = 60

log = structlog.get_logger(__name__)


@dataclass
class FormerSeason:
    """A season of a schedule the board no longer has, as the replay met it."""

    last: datetime
    keys: set[str] = field(default_factory=set)


@dataclass
class Staged:
    """The live names of the keys staged so far, event counters apart (checked at the end)."""

    counters: set[str] = field(default_factory=set)
    others: set[str] = field(default_factory=set)
    # The journal's events' records (their live idempotency records): the finish clears their
    # derive-pending bits.
    records: set[str] = field(default_factory=set)
    # The seasons of a schedule the board no longer has that stored events were written to:
    # (period, period id) -> the latest acceptance of their events, and their keys.
    former: dict[tuple[str, str], FormerSeason] = field(default_factory=dict)

    def add(self, call_keys: Sequence[str]) -> None:
        """The keys a replay of one ``submit()`` call stages (not the write's own keys, for
        which a replay gets scratch keys)."""
        counters, others = replayed_keys(call_keys)
        self.counters.update(counters)
        self.others.update(others)

    def add_former(
        self, season: tuple[str, str], accepted_at: datetime, keys: Iterable[str]
    ) -> None:
        """The keys of a season of a former schedule that a replayed event accepted at
        ``accepted_at`` wrote."""
        found = self.former.get(season)
        if found is None:
            found = self.former[season] = FormerSeason(accepted_at)
        found.last = max(found.last, accepted_at)
        found.keys.update(keys)


def row_periods(board: Board, row: Any) -> tuple[list[tuple[Period, str, int]] | None, list[int]]:
    """The periods (with their expire-at) a stored event is replayed into: those its live write
    put it in, which the event log keeps, and which of them are seasons of a schedule the board
    no longer has (:func:`shared.submit.stored_periods`). An event stored before the log kept
    them (NULL) goes into the board's periods as it is now (None)."""
    if row.periods is None:
        return None, []
    return stored_periods(board, parse_period_ids(row.periods))


def replay_call(
    keys: Keys, settings: LadderSettings, board: Board, row: Any
) -> tuple[list[str], list[str | int]]:
    """The keys (live names) and arguments of ``submit()`` for one stored event (a row of
    :func:`services.rebuild.event_log.page`): what the API's write path built when the event was
    accepted, into the periods it wrote (:func:`row_periods`). The metadata goes back as the
    very text the live write was given, which the event log keeps (NULL, for none, is ``None``
    as it was)."""
    return _call(keys, settings, board, row, row_periods(board, row)[0])


def _call(
    keys: Keys,
    settings: LadderSettings,
    board: Board,
    row: Any,
    periods: list[tuple[Period, str, int]] | None,
) -> tuple[list[str], list[str | int]]:
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
        periods=periods,
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
            periods, former = row_periods(board, row)
            call_keys, args = _call(keys, settings, board, row, periods)
            staged.add(call_keys)
            for i in former:
                assert periods is not None
                season = (periods[i][0], periods[i][1])
                accepted = from_db_time(row.accepted_at)
                staged.add_former(season, accepted, period_call_keys(call_keys, i))
            pipe.fcall(REPLAY_FUNCTION, len(call_keys), *replay_keys(keys, bid, call_keys), *args)
        statuses: list[Any] = await pipe.execute()
    refused = [s for s in statuses if s != "ok"]
    if refused:
        # An event accepted under other bounds than the board has now (or, stored without its
        # periods, into other periods).
        log.warning("events the board refuses now", board_id=bid, statuses=refused[:5])
    return len(refused)


async def expire_former(redis: Redis, keys: Keys, board_id: str, staged: Staged) -> None:
    """The staging keys of the seasons of a former schedule, once every stored event is
    replayed: kept ``FORMER_SEASON_TTL`` past their latest event's acceptance, as the live keys
    are kept past the aggregator's last step on them (its schedule's retention is not known
    any more). Those that would be gone by then are not put in place: their staging copies are
    deleted, and their event counters are no longer checked against the live ones (a season
    the live keys still hold by its former schedule's retention is not a lost event)."""
    if not staged.former:
        return
    now = time.time()
    async with redis.pipeline(transaction=False) as pipe:
        for season in staged.former.values():
            at = int(season.last.timestamp()) + FORMER_SEASON_TTL
            gone = at <= now + FORMER_MARGIN
            for key in sorted(season.keys):
                if gone:
                    pipe.unlink(keys.staged(board_id, key))
                else:
                    pipe.expireat(keys.staged(board_id, key), at)
            if gone:
                counters = season.keys & staged.counters
                staged.counters -= counters
                staged.others |= counters
        await pipe.execute()


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
