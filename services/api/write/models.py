"""What a score write takes and answers (docs/api.md section 4), as the OpenAPI document shows
them."""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictInt

from shared.events import DisplayName, EventId, Region, TeamId, UserId
from shared.ranking import MAX_SCORE


class ScoreIn(BaseModel):
    """A score as a game sends it."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "event_id": "c0ffee-42",
                    "user_id": "u-42",
                    "region": "eu",
                    "value": 25,
                    "team_id": "red-wombats",
                    "display_name": "Ana",
                }
            ]
        },
    )

    event_id: EventId | None = Field(default=None, description="Idempotency key")
    user_id: UserId
    region: Region
    value: StrictInt = Field(
        ge=-MAX_SCORE, le=MAX_SCORE, description="A delta (incr) or a score (best, set)"
    )
    team_id: TeamId | None = None
    display_name: DisplayName | None = None
    occurred_at: AwareDatetime | None = Field(default=None, description="Defaults to now")


class PeriodOut(BaseModel):
    period_id: str
    score: int
    rank: int = Field(description="1-based rank in the user's region for this period")
    previous_rank: int | None
    improved: bool


class ScoreOut(BaseModel):
    event_id: str
    duplicate: bool
    board_id: str
    user_id: str
    region: str
    periods: dict[str, PeriodOut]
