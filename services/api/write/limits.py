"""Score submission rates (docs/api.md section 9a): a user's and a credential's, taken inside the
write itself."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import Counter

from services.api.auth import Principal, key_id
from services.api.errors import Problem
from shared.keys import Keys
from shared.settings import LadderSettings

LIMITED = Counter("ladder_api_rate_limited_total", "Submissions refused with 429", ["bucket"])
for _bucket in ("user", "key"):  # each series at 0 from the start, for an alert on its rise
    LIMITED.labels(_bucket)


class RateLimited(Problem):
    status, title, slug = 429, "Too many requests", "rate-limited"

    def __init__(self, detail: str, retry_after_ms: int) -> None:
        super().__init__(
            detail, headers={"Retry-After": str(max(1, math.ceil(retry_after_ms / 1000)))}
        )


def _credential_id(principal: Principal, credential: str) -> str:
    if principal.kind == "player" and principal.user_id:
        return "player:" + principal.user_id
    return key_id(credential)


@dataclass(frozen=True, slots=True)
class Quota:
    """The rate limits one request's score writes are held to (docs/api.md section 9a).

    The limits are checked and taken inside the write itself (``WRITE_FUNCTION``), so a score
    costs one Redis round trip and a refused one writes nothing at all. Both buckets live under
    the board's hash tag: a Redis Function may touch keys of one hash slot only, and the write's
    keys are the board's. So a user's and a credential's rates hold per board, across every API
    process (docs/architecture.md, "Rate limits").
    """

    keys: Keys
    board_id: str
    credential_id: str
    user_rate: float
    key_rate: float

    def call(self, user_id: str, now_ms: int) -> tuple[list[str], list[str | int | float]]:
        """The bucket keys and arguments that go in front of a write's own."""
        return (
            [
                self.keys.rate_bucket(self.board_id, "user", user_id),
                self.keys.rate_bucket(self.board_id, "key", self.credential_id),
            ],
            # A user may burst to twice its rate; a credential to its rate.
            [self.user_rate, 2 * self.user_rate, self.key_rate, self.key_rate, now_ms],
        )


def quota(
    keys: Keys,
    settings: LadderSettings,
    board_id: str,
    principal: Principal,
    credential: str,
) -> Quota:
    return Quota(
        keys,
        board_id,
        _credential_id(principal, credential),
        settings.user_rate,
        settings.key_rate,
    )


def longest(payloads: Iterable[str]) -> str:
    """Of the write function's ``limited`` payloads (``"<bucket> <ms>"``), the one that waits
    longest: a batch refused as a whole waits until every one of its events could go, each
    until both its buckets have a token (docs/api.md section 9a), not only its first event."""
    return max(payloads, key=lambda payload: float(payload.partition(" ")[2] or "0"))


def refusal(payload: str, user_id: str) -> RateLimited:
    """The 429 for a write the function refused with ``limited``: ``"<bucket> <ms>"``."""
    bucket, _, wait_ms = payload.partition(" ")
    LIMITED.labels(bucket).inc()
    if bucket == "user":
        detail = f"Score submissions by user {user_id!r} are over the limit."
    else:
        detail = "Score submissions by this credential are over the limit."
    return RateLimited(detail, int(float(wait_ms or "1000")))
