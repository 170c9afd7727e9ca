"""The simulation's parameters: one pydantic model, every field changeable while it runs.

A change arrives as a name and a value (``python -m sim.set robot_share 1.0``); it is checked
here, against the same constraints, both before it is published and when a running simulation
applies it. Each draw reads the parameters in force at that moment, so a change applies from the
next arrival or round.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class UnknownParameter(ValueError):
    """A name that is not a parameter of the simulation."""


class InvalidValue(ValueError):
    """A value the parameter does not take."""


# The kinds of value the parameters take, each kind's bounds stated once. Times are seconds.
Share = Annotated[float, Field(ge=0, le=1)]  # a share or a chance
Seconds = Annotated[float, Field(gt=0, le=3600)]  # a mean length, up to an hour
SecondsSd = Annotated[float, Field(ge=0, le=3600)]  # a spread around such a mean, 0 for none
DaySeconds = Annotated[float, Field(gt=0, le=86_400)]  # a mean length, up to a day
DaySecondsSd = Annotated[float, Field(ge=0, le=86_400)]  # a spread or delay up to a day, or 0
Count = Annotated[int, Field(ge=1, le=1000)]
Factor = Annotated[float, Field(gt=0, le=100)]


class SimParams(BaseModel):
    """What the simulated game looks like. Times are seconds of simulated time, except where a
    field says wall-clock."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arrival_mean_s: Seconds = Field(2.0, description="mean time between player arrivals (Poisson)")
    session_mean_s: DaySeconds = Field(300.0, description="mean session length (lognormal)")
    session_sd_s: DaySecondsSd = Field(120.0, description="standard deviation of session length")
    round_mean_s: Seconds = Field(6.0, description="mean length of a player's round (lognormal)")
    round_sd_s: SecondsSd = Field(2.0, description="standard deviation of a round's length")
    score_max: Count = Field(20, description="a round scores an integer from 0 to this")
    skill_spread: Factor = Field(
        2.0, description="players' skill is Beta(a, a) with this a: smaller means more spread"
    )
    robot_share: Share = Field(0.05, description="share of arriving players that are robots")
    robot_round_s: Seconds = Field(1.5, description="mean length of a robot's round (normal)")
    robot_round_sd_s: SecondsSd = Field(0.3, description="standard deviation of a robot's round")
    robot_skill: Share = Field(0.5, description="a robot's chance of each point of score_max")
    team_max: Count = Field(15, description="players a team holds at most")
    new_team_chance: Share = Field(
        0.1, description="chance that an arriving player forms a new team"
    )
    late_share: Share = Field(0.01, description="share of scores sent late, with their own time")
    late_delay_mean_s: DaySecondsSd = Field(
        120.0,
        description="mean delay of a late score (exponential, kept within the allowed lateness)",
    )
    speed: Factor = Field(1.0, description="simulated seconds per wall-clock second")
    tick_s: float = Field(
        1.0, ge=0.05, le=60, description="wall-clock seconds between two batches posted"
    )

    def changed(self, name: str, value: Any) -> SimParams:
        """These parameters with ``name`` set to ``value``, checked as a whole."""
        return self.model_validate({**self.model_dump(), name: parse_value(name, value)})


def parse_value(name: str, value: Any) -> Any:
    """``value`` checked for the parameter ``name`` alone (strings as a command line gives
    them are converted); raises :class:`UnknownParameter` or :class:`InvalidValue`."""
    if name not in SimParams.model_fields:
        raise UnknownParameter(
            f"unknown parameter {name!r}; one of: {', '.join(SimParams.model_fields)}"
        )
    try:
        checked = SimParams.model_validate({name: value})
    except ValidationError as exc:
        reason = "; ".join(str(e["msg"]) for e in exc.errors(include_url=False))
        raise InvalidValue(f"{name}={value!r}: {reason}") from None
    parsed = getattr(checked, name)
    if isinstance(parsed, float) and not math.isfinite(parsed):
        raise InvalidValue(f"{name}={value!r}: not a finite number")
    return parsed


def describe() -> str:
    """Every parameter, its default and its meaning, one a line."""
    rows = []
    for name, field in SimParams.model_fields.items():
        rows.append(f"  {name:<18} {field.default!s:>7}  {field.description}")
    return "\n".join(rows)


def lognormal_mu_sigma(mean: float, sd: float) -> tuple[float, float]:
    """The underlying normal's (mu, sigma) of a lognormal with this mean and standard deviation:
    sigma² = ln(1 + sd²/mean²), mu = ln(mean) - sigma²/2."""
    sigma2 = math.log1p((sd / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)
