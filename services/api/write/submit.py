"""The score write: validate, then one Redis Function call (docs/api.md section 4).

A client's write runs as ``WRITE_FUNCTION``: the rate limits of docs/api.md section 9a checked and
taken in the same atomic call as the write, so a score costs one Redis round trip (a batch one
pipeline) and a refused one writes nothing. ``SUBMIT_FUNCTION`` is the write alone. Both are sent
in the lean layout, naming only the keys the write touches; while the board is being rebuilt
that call answers ``rebuilding`` having written nothing, and the write goes again in the
journaled layout (``JOURNALED_*``), which names every key a replay of it writes (shared/submit.py,
shared/lua/write.lua): one round trip more a write, during a rebuild only.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from services.api.errors import Conflict, Invalid, Unavailable
from services.api.write.durable import Durability
from services.api.write.limits import Quota, refusal
from services.api.write.models import ScoreIn, metadata_text
from shared.boards import Board
from shared.functions import (
    JOURNALED_SUBMIT_FUNCTION,
    JOURNALED_WRITE_FUNCTION,
    SUBMIT_FUNCTION,
    WRITE_FUNCTION,
)
from shared.keys import Keys
from shared.periods import PERIODS, Period
from shared.settings import LadderSettings
from shared.submit import SubmitEvent, submit_call


def body_hash(score: ScoreIn) -> str:
    """What makes two submissions of one ``event_id`` "the same body". It covers the
    ``user_id``: a record of the layout before, named by the id alone, tells a retry of its
    event (the same hash) from another user's event of that id only by it. ``occurred_at`` is
    a moment, whatever its offset: in UTC, as a body sent in UTC always hashed."""
    moment = {"occurred_at": score.occurred_at and score.occurred_at.astimezone(UTC)}
    canonical = score.model_copy(update=moment).model_dump(mode="json", exclude={"event_id"})
    # Left out where not given, so that a body hashes as it did before they existed.
    for optional in ("subscore", "metadata"):
        if canonical[optional] is None:
            del canonical[optional]
    # 64 bits: it tells apart only bodies sent under one event_id, so a different body passes
    # for the first with a chance of 2**-64, and the event's record stays short. (The record
    # layout before kept 32 digits, of which these are the first: shared/lua/write.lua.)
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def resolve_event_id(score: ScoreIn, header: str | None) -> str:
    if header is not None:
        if score.event_id is not None and score.event_id != header:
            raise Invalid("Idempotency-Key and event_id differ.", loc=("body", "event_id"))
        return header
    return score.event_id or uuid.uuid4().hex


def check_time(occurred_at: datetime, now: datetime, settings: LadderSettings) -> None:
    late, ahead = settings.allowed_lateness, settings.future_tolerance_seconds
    if occurred_at < now - timedelta(seconds=late):
        why = f"older than the allowed lateness of {late:g} seconds."
    elif occurred_at > now + timedelta(seconds=ahead):
        why = f"more than the future tolerance of {ahead:g} seconds ahead of the server's clock."
    else:
        return
    raise Invalid(f"occurred_at is {why}", loc=("body", "occurred_at"))


def check_value(score: ScoreIn, board: Board) -> None:
    """The region among the board's declared ones; the value within the board's bounds; a
    subscore where, and only where, the board ranks by one."""
    if not board.names_region(score.region):
        raise Invalid(
            f"Board {board.board_id!r} has no region {score.region!r}; its regions are "
            f"{', '.join(board.regions or ())}.",
            loc=("body", "region"),
        )
    if not board.min_value <= score.value <= board.max_value:
        raise Invalid(
            f"value must be within [{board.min_value}, {board.max_value}] on this board.",
            loc=("body", "value"),
        )
    if board.subscore_order is not None and score.subscore is None:
        raise Invalid(
            f"Board {board.board_id!r} ranks equal scores by subscore "
            f"({board.subscore_order}): every score carries one.",
            loc=("body", "subscore"),
        )
    if board.subscore_order is None and score.subscore is not None:
        raise Invalid(
            f"Board {board.board_id!r} has no subscore_order: a subscore would rank nothing.",
            loc=("body", "subscore"),
        )


# The period of each code in a record's compact answer: the name's initial (upper case: improved).
_PERIOD_CODES: dict[str, Period] = {name[0]: name for name in PERIODS}
assert len(_PERIOD_CODES) == len(PERIODS), "each period needs an initial of its own"


def _periods_from_record(answer: str) -> dict[str, dict[str, Any]]:
    """The periods of a first answer as the event's record keeps it (shared/lua/write.lua):
    ``<code><period_id> <score> <rank> <previous rank>`` per period, numbers in base 36, ``;``
    between periods."""
    found: dict[str, dict[str, Any]] = {}
    for part in answer.split(";") if answer else ():
        head, score, rank, previous = part.split(" ")
        found[_PERIOD_CODES[head[0].lower()]] = {
            "period_id": head[1:],
            "score": int(score, 36),
            "rank": int(rank, 36),
            "previous_rank": int(previous, 36) if previous else None,
            "improved": head[0].isupper(),
        }
    return {name: found[name] for name in PERIODS if name in found}


def response_from_record(
    answer: str, event_id: str, board_id: str, user_id: str, region: str
) -> dict[str, Any]:
    """The duplicate's answer: the first answer the record keeps, with the event's own fields
    from the request (its body hashed the same). A record of the layout before holds the
    outbox entry (JSON) instead."""
    if answer.startswith("{"):
        return response_from_entry(answer, duplicate=True)
    return {
        "event_id": event_id,
        "duplicate": True,
        "board_id": board_id,
        "user_id": user_id,
        "region": region,
        "periods": _periods_from_record(answer),
    }


# A period's outbox result's fields for the consumers only: not in the answer, nor a duplicate's.
_ENTRY_ONLY = frozenset({"pushed_out", "pulled_in", "previous_score", "previous_subscore"})


def response_from_entry(entry: str, duplicate: bool) -> dict[str, Any]:
    accepted = orjson.loads(entry)
    return {
        "event_id": accepted["event_id"],
        "duplicate": duplicate,
        "board_id": accepted["board_id"],
        "user_id": accepted["user_id"],
        "region": accepted["region"],
        "periods": {
            name: {k: v for k, v in accepted["periods"][name].items() if k not in _ENTRY_ONLY}
            for name in PERIODS
            if name in accepted["periods"]
        },
    }


log = structlog.get_logger(__name__)

# What the lean write answers while its board is being rebuilt, having written nothing.
REBUILDING = "rebuilding"
# The status of a write whose call failed in Redis (a script error), answered 503 on its own.
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Call:
    """One prepared write (its keys in the lean layout, and how to name them in the journaled
    one), or the answer already known without one."""

    event_id: str
    user_id: str
    keys: list[str]
    args: list[str | int]
    known: dict[str, Any] | None = None
    board_id: str = ""
    region: str = ""
    journaled_keys: Callable[[], list[str]] | None = None

    def command(self, quota: Quota | None, now_ms: int, *, journaled: bool = False) -> list[Any]:
        """The FCALL arguments: the write under ``quota``'s limits, or the bare write; in the
        lean layout, or in the journaled one (to send again after a ``rebuilding`` answer)."""
        call_keys = self.keys
        if journaled:
            assert self.journaled_keys is not None, "a call without keys has no journaled form"
            call_keys = self.journaled_keys()
        if quota is None:
            function = JOURNALED_SUBMIT_FUNCTION if journaled else SUBMIT_FUNCTION
            return [function, len(call_keys), *call_keys, *self.args]
        limit_keys, limit_args = quota.call(self.user_id, now_ms)
        return [
            JOURNALED_WRITE_FUNCTION if journaled else WRITE_FUNCTION,
            len(limit_keys) + len(call_keys),
            *limit_keys,
            *call_keys,
            *limit_args,
            *self.args,
        ]


async def prepare(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    board: Board,
    score: ScoreIn,
    event_id: str,
    now: datetime,
) -> Call:
    """Validate one score against its board and build its write; raises a :class:`Problem`."""
    occurred_at = score.occurred_at or now
    digest = body_hash(score)
    try:
        check_time(occurred_at, now, settings)
        check_value(score, board)
    except Invalid:
        # A retry of an event accepted earlier is still a duplicate, however late it comes or
        # however the board's definition changed since (its regions, its value range): its
        # record, or the record of the layout before under its id alone (write.lua's refusal()
        # reads them in that order).
        bid = board.board_id
        stored: list[Any] = await redis.mget(
            keys.idempotency(bid, event_id, score.user_id), keys.legacy_idempotency(bid, event_id)
        )
        first = _first_answer(stored[0]) or _first_answer(stored[1])
        if first is None:
            raise
        first_hash, answer_kept = first
        if first_hash != digest:
            raise Conflict(
                f"event_id {event_id!r} was already accepted with a different body."
            ) from None
        known = response_from_record(
            answer_kept, event_id, board.board_id, score.user_id, score.region
        )
        return Call(event_id, score.user_id, [], [], known)
    event = SubmitEvent(
        event_id,
        score.user_id,
        score.region,
        score.team_id,
        score.display_name,
        score.value,
        occurred_at,
        now,
        score.subscore,
        metadata_text(score.metadata) if score.metadata is not None else None,
    )

    def call_of(journaled: bool) -> tuple[list[str], list[str | int]]:
        return submit_call(
            keys,
            board,
            event,
            body_hash=digest,
            idempotency_ttl=settings.idempotency_ttl_seconds,
            outbox_max=settings.outbox_max,
            feed_length=settings.feed_length,
            journaled=journaled,
        )

    call_keys, args = call_of(False)
    return Call(
        event_id,
        score.user_id,
        call_keys,
        args,
        None,
        board.board_id,
        score.region,
        lambda: call_of(True)[0],
    )


def _first_answer(stored: str | None) -> tuple[str, str] | None:
    """(body hash, answer) of an event's record as shared/lua/write.lua ``refusal()`` reads it;
    None for none, or for a record of consumers' marks alone."""
    if stored is None or len(stored) <= 1:
        return None
    if stored[32:33] == "\n":  # the layout before: 32 digits of hash, of which ours are the first
        return stored[:16], stored[33:]
    return stored[1:17], stored[17:]


def answer(status: str, payload: str, call: Call) -> dict[str, Any]:
    """The answer to a client from what the write function returned; or a :class:`Problem`."""
    event_id = call.event_id
    if status == "ok":
        return response_from_entry(payload, duplicate=False)
    if status == "duplicate":
        return response_from_record(payload, event_id, call.board_id, call.user_id, call.region)
    if status == "conflict":
        raise Conflict(f"event_id {event_id!r} was already accepted with a different body.")
    if status == "range":
        raise Invalid(f"The score cannot be ranked exactly: {payload}.", loc=("body", "value"))
    if status == "expired":
        raise Invalid(f"The event is too late: {payload}.", loc=("body", "occurred_at"))
    if status == "outbox_full":
        raise Unavailable("The broker is behind and the outbox is full; retry shortly.", 5)
    if status == "limited":
        raise refusal(payload, call.user_id)
    if status == FAILED:
        raise Unavailable("The write failed in Redis; retry shortly.", 1)
    raise RuntimeError(f"unexpected answer from {SUBMIT_FUNCTION}: {status!r}")


async def submit(
    redis: Redis,
    keys: Keys,
    settings: LadderSettings,
    board: Board,
    score: ScoreIn,
    event_id: str,
    quota: Quota | None = None,
) -> dict[str, Any]:
    """Write one score atomically, within ``quota`` if given: the answer of docs/api.md section 4,
    or a :class:`Problem`."""
    call = await prepare(redis, keys, settings, board, score, event_id, datetime.now(UTC))
    if call.known is not None:
        return call.known

    async def fcall(command: list[Any]) -> tuple[str, str]:
        # Straight to execute_command: fcall()'s deprecation wrapper costs more than the call.
        status, payload = await redis.execute_command("FCALL", *command)  # type: ignore[no-untyped-call]
        return status, payload

    status, payload = await write_one(fcall, call, quota)
    return answer(status, payload, call)


async def write_one(
    send: Callable[[list[Any]], Awaitable[tuple[str, str]]], call: Call, quota: Quota | None
) -> tuple[str, str]:
    """``send`` the call's ``FCALL`` arguments, lean; while the board is being rebuilt (the answer
    ``rebuilding``), once more, journaled. The write function's ``(status, payload)``."""
    status, payload = await send(call.command(quota, int(time.time() * 1000)))
    if status == REBUILDING:
        status, payload = await send(call.command(quota, int(time.time() * 1000), journaled=True))
    return status, payload


async def submit_many(
    redis: Redis,
    calls: list[Call],
    quota: Quota | None = None,
    durability: Durability | None = None,
) -> list[tuple[str, str]]:
    """Run prepared writes in one round trip; ``(status, payload)`` for each, in order.

    Each call is atomic on its own; a later call sees what an earlier one wrote (so an
    ``event_id`` twice in one batch is a duplicate the second time). With ``durability`` that
    waits, the round trip ends with ``WAIT`` (write/durable.py), and too few replicas raise its
    :class:`ReplicasBehind` if any write would be answered 2xx.
    """
    if not calls:
        return []
    now_ms = int(time.time() * 1000)
    durability = durability or Durability(0, 1)
    out = await _pipelined(redis, [call.command(quota, now_ms) for call in calls], durability)
    # Those a rebuild of the board refused, again in order, journaled.
    again = [i for i, (status, _) in enumerate(out) if status == REBUILDING]
    if again:
        commands = [calls[i].command(quota, now_ms, journaled=True) for i in again]
        replies = await _pipelined(redis, commands, durability)
        for i, reply in zip(again, replies, strict=True):
            out[i] = reply
    return out


async def _pipelined(
    redis: Redis, commands: list[list[Any]], durability: Durability
) -> list[tuple[str, str]]:
    """``FCALL`` each command in one pipeline (ended by ``durability``'s ``WAIT``)."""
    async with redis.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command("FCALL", *command)
        await durability.queue(pipe)
        started = time.perf_counter()
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    short = durability.shortfall(pipe, replies[len(commands) :], started)
    out = []
    for reply in replies[: len(commands)]:
        if isinstance(reply, Exception):
            # This write's own failure (a script error): the others of the round trip stand,
            # and each is answered on its own.
            log.error("score write failed in Redis", error=str(reply))
            out.append((FAILED, str(reply)))
        else:
            out.append((str(reply[0]), str(reply[1])))
    if short is not None and any(status in ("ok", "duplicate") for status, _ in out):
        raise short
    return out
