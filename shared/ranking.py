"""How a score and the moment it was reached share one sorted-set score.

Redis sorted-set scores are IEEE doubles: integers are exact up to 2**53. Ladder packs

    composite = signed_score * 2**T + (2**T - 1 - tick)

where ``signed_score`` is the score (negated on ``asc`` boards, so that the best is always the
highest composite), ``tick`` is when the score was reached, counted in the period's unit from the
period's start, and ``T`` the period's time bits. A higher composite ranks higher; between equal
scores, the one reached earlier has the smaller tick and so the higher composite. Every read is
then a plain ``ZREVRANGE``/``ZREVRANK``.

=========  =========  =========  ============================  ===============================
period     tick unit  time bits  time span                     largest score held exactly
=========  =========  =========  ============================  ===============================
daily      1 ms       27         37.2 h (a day is at most 25)  ±67,108,863 (2**26 - 1)
weekly     10 ms      26         7.8 days                      ±134,217,727 (2**27 - 1)
monthly    100 ms     25         38.8 days                     ±268,435,455 (2**28 - 1)
alltime    1 s        30         34 years from 2024-01-01      ±8,388,607 (2**23 - 1)
=========  =========  =========  ============================  ===============================

A write whose resulting score would leave its period's range is refused with 422 before anything
is written. Two scores reached within the same tick tie exactly; Redis then orders them by
member, and Ladder's reads keep that order. All-time ticks stop at 2058-01-10 (2**30 seconds
from 2024); past it, all-time ties are ordered by member.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.periods import Period, PeriodWindow


@dataclass(frozen=True, slots=True)
class Encoding:
    tick_ms: int
    time_bits: int

    @property
    def scale(self) -> int:
        return 1 << self.time_bits

    @property
    def max_score(self) -> int:
        return (1 << (53 - self.time_bits)) - 1


ENCODINGS: dict[Period, Encoding] = {
    "daily": Encoding(tick_ms=1, time_bits=27),
    "weekly": Encoding(tick_ms=10, time_bits=26),
    "monthly": Encoding(tick_ms=100, time_bits=25),
    "alltime": Encoding(tick_ms=1000, time_bits=30),
}

# The narrowest range of any period: what a board's value bounds may not exceed.
MAX_SCORE = min(e.max_score for e in ENCODINGS.values())


def tick(window: PeriodWindow, moment: datetime) -> int:
    """Ticks from the start of ``window`` to ``moment``, clamped into the period's time bits."""
    enc = ENCODINGS[window.period]
    elapsed_ms = int((moment - window.start).total_seconds() * 1000)
    return min(max(elapsed_ms // enc.tick_ms, 0), enc.scale - 1)


def encode(period: Period, score: int, reached_tick: int, descending: bool) -> float:
    enc = ENCODINGS[period]
    signed = score if descending else -score
    return float(signed * enc.scale + (enc.scale - 1 - reached_tick))


def decode(period: Period, composite: float, descending: bool) -> tuple[int, int]:
    """``(score, tick)`` of a composite."""
    enc = ENCODINGS[period]
    whole = int(composite)
    signed = whole // enc.scale
    reached_tick = enc.scale - 1 - (whole - signed * enc.scale)
    return (signed if descending else -signed), reached_tick


def decode_score(period: Period, composite: float, descending: bool) -> int:
    return decode(period, composite, descending)[0]
