"""The path and query parameters the read routes share, declared once so that every route
documents and checks them alike."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import StringConstraints

from services.api.reads import views
from services.api.reads.styles import RankStyle
from shared.events import USER_ID_PATTERN
from shared.periods import Period

UserIdPath = Annotated[str, Path(pattern=USER_ID_PATTERN, examples=["u-42"])]
ScopeQuery = Annotated[
    str,
    Query(
        max_length=80,
        pattern=views.SCOPE_PATTERN,
        description="global, region:{region}, teams (incr boards) or friends:{user_id} (that "
        "player's token or a server key)",
    ),
]
# The standing read takes a user, and the teams scope has none (422 there): the document leaves
# it out, while the server's own check keeps giving that 422 its message.
UserScopeQuery = Annotated[
    str,
    Query(
        max_length=80,
        pattern=views.SCOPE_PATTERN,
        json_schema_extra={"pattern": views.SCOPE_PATTERN.replace("|teams|", "|")},
        description="global, region:{region} or friends:{user_id} (that player's token or a "
        "server key)",
    ),
]
PeriodQuery = Annotated[Period, Query()]
PeriodIdQuery = Annotated[
    str | None,
    Query(
        max_length=16, pattern=views.PERIOD_ID_PATTERN, description="Defaults to the current period"
    ),
]
RankStyleQuery = Annotated[
    RankStyle,
    Query(
        description="ordinal: every rank unique (ties to whoever got there first); "
        "competition: equal scores share a rank and the next skips (1, 1, 3); "
        "dense: equal scores share a rank and the next does not skip (1, 1, 2)"
    ),
]
PeriodIdItem = Annotated[str, StringConstraints(max_length=16, pattern=views.PERIOD_ID_PATTERN)]
