"""The score event as it travels from the API to the consumers (schema version 1).

A broker message body is a :class:`ScoreMessage`: ``{"schema": 1, "events": [...]}``, one event or
several in the order they were accepted. Each event is a :class:`ScoreAccepted`: what the client
sent, when Ladder accepted it, and what the atomic write saw in each period of the user's region.
A body that is not a valid message as a whole but has the message's envelope is read event by
event (:func:`split_message`), so that one event failing the schema costs the others nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
)

from shared.boards import BoardId
from shared.periods import PERIODS, Period
from shared.ranking import MAX_SCORE

SCHEMA_VERSION = 1

USER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
EVENT_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
REGION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
# A Redis stream entry id, <ms>-<seq>: each part an unsigned 64-bit number.
OUTBOX_ID_PATTERN = r"^[0-9]{1,20}-[0-9]{1,20}$"

UserId = Annotated[str, Field(pattern=USER_ID_PATTERN)]
EventId = Annotated[str, Field(pattern=EVENT_ID_PATTERN)]
Region = Annotated[str, Field(pattern=REGION_PATTERN)]
TeamId = Annotated[str, Field(pattern=REGION_PATTERN)]


def _stream_id(value: str) -> str:
    # Each part must fit the event log's signed BIGINT; a stream id from Redis always does.
    if any(int(part) >= 2**63 for part in value.split("-")):
        raise ValueError("each part of a stream id must be under 2**63")
    return value


OutboxId = Annotated[str, Field(pattern=OUTBOX_ID_PATTERN), AfterValidator(_stream_id)]


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError(
            "must be printable: no control or format characters, and no separator but the space"
        )
    if value.isspace():
        raise ValueError("must show something: not spaces only")
    return value


DisplayName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64),
    AfterValidator(_printable),
    Field(
        description="1 to 64 printable characters (no control or format characters, no "
        "separator but the space), not spaces only"
    ),
]

# RFC 3339's date-time: full date, T (or t, or a space, as section 5.6 allows), time with
# optional fraction, and an offset (Z or +hh:mm).
RFC3339_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
_RFC3339 = re.compile(RFC3339_PATTERN)


def _rfc3339(value: object) -> object:
    """A time as a client sends it: an RFC 3339 string with an offset, not a number of seconds
    (which pydantic's lax datetimes would take) nor another ISO 8601 form. A datetime built in
    code passes as it is."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not _RFC3339.fullmatch(value):
        text = value if isinstance(value, str) else ""
        if text[-6:-5] == " " and _RFC3339.fullmatch(f"{text[:-6]}+{text[-5:]}"):
            # A query string's '+' decodes to a space: the offset came as " 01:00".
            raise ValueError(
                "must be an RFC 3339 time with an offset; the offset's '+' arrived as a space: "
                "in a query string send it as %2B, like 2026-11-29T18:00:00%2B01:00"
            )
        raise ValueError("must be an RFC 3339 time with an offset, like 2026-11-29T17:00:00Z")
    try:
        datetime.fromisoformat(value.upper())
    except ValueError as exc:
        # Of RFC 3339's form but no time there is: say which part, not pydantic's "unexpected
        # extra characters" (a leap second's :60, which RFC 3339 allows, has no datetime).
        why = str(exc)
        if value[17:19] == "60":
            why = "a leap second (:60) is not taken"
        elif "offset" in why:
            why = "an offset's hours are 00 to 23 and its minutes 00 to 59"
        raise ValueError(f"names no time: {why}") from None
    return value


Rfc3339Time = Annotated[
    AwareDatetime,
    BeforeValidator(_rfc3339),
    WithJsonSchema({"type": "string", "format": "date-time", "pattern": RFC3339_PATTERN}),
]
"""A time a client sends (``occurred_at``, ``at``): RFC 3339 with an offset, nothing else."""


class PeriodResult(BaseModel):
    """The user's standing in its region for one period, read in the same atomic step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    period_id: str
    score: int
    rank: int
    previous_rank: int | None
    improved: bool
    # bracket T (as a string, JSON keys are) -> the user this write pushed out of the top T
    pushed_out: dict[str, str] = Field(default_factory=dict)
    # bracket T -> the user a fall of this write's user moved up into the top T (now at rank T,
    # at T + 1 before); absent from the JSON when nobody, and from entries written before it
    pulled_in: dict[str, str] = Field(default_factory=dict)
    # Where the write changed an entry the user had (improved): the score it held before, and
    # on boards with a subscore its subscore. Absent otherwise (a first entry, or unchanged).
    # The aggregator keeps a regional view's distinct-score set by the pair before and after.
    previous_score: int | None = Field(default=None, ge=-MAX_SCORE, le=MAX_SCORE)
    previous_subscore: int | None = Field(default=None, ge=-MAX_SCORE, le=MAX_SCORE)


class ScoreAccepted(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: EventId
    board_id: BoardId
    user_id: UserId
    region: Region
    team_id: TeamId | None = None
    display_name: DisplayName | None = None
    value: int = Field(ge=-MAX_SCORE, le=MAX_SCORE)
    # On boards with a subscore_order; the object kept with the entry (shared/ranking.py).
    subscore: int | None = Field(default=None, ge=-MAX_SCORE, le=MAX_SCORE)
    metadata: dict[str, Any] | None = None
    occurred_at: AwareDatetime
    accepted_at: AwareDatetime
    periods: dict[Period, PeriodResult]
    # The event's entry id in its board's outbox stream, which the relay adds as it publishes:
    # the stream orders a board's writes exactly as they were applied, whichever relay publishes
    # them, and the event log keeps it so that a rebuild replays in that order. Absent from
    # events published before it was added.
    outbox_id: OutboxId | None = None


class ScoreMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = Field(alias="schema")
    events: list[ScoreAccepted] = Field(min_length=1)


class MessageEnvelope(BaseModel):
    """A :class:`ScoreMessage` with its events unread: the schema version and a list."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = Field(alias="schema")
    events: list[Any] = Field(min_length=1)


@dataclass(frozen=True)
class EventRefusal:
    """An event of a message that fails the schema alone: what can be read of it, and why."""

    board_id: str | None
    event_id: str | None
    errors: list[dict[str, Any]]


def _readable(event: object, name: str) -> str | None:
    """A field of an event that failed the schema, for the log, if it is a string at all."""
    value = event.get(name) if isinstance(event, dict) else None
    return value[:100] if isinstance(value, str) else None


def why_invalid(exc: BaseException) -> list[dict[str, Any]]:
    """A validation error's first few errors as a log line's ``errors`` carries them, JSON all
    through (each error's ``loc``, ``msg`` and ``type``, without the input: an event's own
    data); another exception (a nesting too deep to read) as one such error, at no ``loc``."""
    if isinstance(exc, ValidationError):
        found = exc.errors(include_url=False, include_input=False, include_context=False)[:3]
        return [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in found]
    return [{"loc": [], "msg": repr(exc), "type": type(exc).__name__}]


def split_message(body: bytes) -> tuple[list[ScoreAccepted], list[EventRefusal]] | None:
    """The events of a body that is not a valid :class:`ScoreMessage` as a whole, each validated
    alone as the whole would have been (its JSON through ``model_validate_json``): the valid
    ones, in order, and a refusal for each other one. ``None`` when the body is not JSON or
    not the message's envelope (another schema version, no events): nothing in it is read.

    The body is read by the standard library's parser, which takes JSON nested deeper than
    pydantic's (about 200 levels), so that an event with metadata that deep is refused alone."""
    try:
        envelope = MessageEnvelope.model_validate(json.loads(body))
    except (ValueError, RecursionError):  # bad JSON and ValidationError are ValueErrors
        return None
    valid: list[ScoreAccepted] = []
    refused: list[EventRefusal] = []
    for event in envelope.events:
        try:
            valid.append(ScoreAccepted.model_validate_json(json.dumps(event)))
        except (ValueError, RecursionError) as exc:  # a ValidationError is a ValueError
            refused.append(
                EventRefusal(
                    _readable(event, "board_id"), _readable(event, "event_id"), why_invalid(exc)
                )
            )
    return valid, refused


def message_body(entries: list[str]) -> bytes:
    """A message body from outbox entries, each already a :class:`ScoreAccepted` JSON object."""
    return (f'{{"schema":{SCHEMA_VERSION},"events":[{",".join(entries)}]}}').encode()


def with_outbox_id(entry_id: str, event: str) -> str:
    """The outbox entry ``event`` (a :class:`ScoreAccepted` JSON object, as the write function
    made it: ``{"event_id":...}``) with its stream id ``entry_id`` as ``outbox_id``, spliced in
    at the front of its text rather than parsed and written again. Text that is no object is
    left as it is: the consumers reject its message as they would have without the id."""
    if not event.startswith("{") or event.startswith("{}"):
        return event
    return f'{{"outbox_id":"{entry_id}",{event[1:]}'


def outbox_position(outbox_id: str) -> tuple[int, int]:
    """The (milliseconds, sequence) of a stream entry id: ids compare by these as numbers, not
    as text ("9-0" comes before "10-0")."""
    ms, _, seq = outbox_id.partition("-")
    return int(ms), int(seq)


def rfc3339(moment: datetime) -> str:
    """``2026-11-29T17:00:00.123Z``: milliseconds, UTC."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def period_ids_text(periods: Mapping[Period, PeriodResult]) -> str:
    """The periods an event was written to, as the event log keeps them (``score_events.periods``):
    ``daily=2026-11-29,alltime=all``, in the write's order. No period id holds a comma or an
    equals sign (shared/periods.py)."""
    return ",".join(f"{period}={result.period_id}" for period, result in periods.items())


def parse_period_ids(text: str) -> list[tuple[Period, str]]:
    """The (period, period_id) pairs of :func:`period_ids_text`'s text; ValueError if it is not
    such a text."""
    pairs: list[tuple[Period, str]] = []
    for part in text.split(",") if text else ():
        period, sep, period_id = part.partition("=")
        if not sep or period not in PERIODS or not period_id:
            raise ValueError(f"{text!r} is not a list of period ids")
        pairs.append((period, period_id))
    return pairs
