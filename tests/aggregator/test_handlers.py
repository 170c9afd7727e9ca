"""How the aggregator's handlers of a batch are put together (services/aggregator/handlers.py):
the derive step before the dirty marks, the live views alongside both, and a failure of any of
them raised only once every one has run to its end."""

from __future__ import annotations

import asyncio

import pytest

from services.aggregator.handlers import aggregate
from shared.events import ScoreAccepted


class Step:
    """A handler that notes when it starts and ends, waiting ``seconds`` between, and may fail."""

    def __init__(self, name: str, log: list[str], seconds: float, fails: bool = False) -> None:
        self.name, self.log, self.seconds, self.fails = name, log, seconds, fails
        self.batches: list[list[ScoreAccepted]] = []

    async def __call__(self, events: list[ScoreAccepted]) -> None:
        self.log.append(f"{self.name} start")
        self.batches.append(events)
        await asyncio.sleep(self.seconds)
        self.log.append(f"{self.name} end")
        if self.fails:
            raise RuntimeError(f"{self.name} failed")


async def test_the_marks_wait_for_the_derive_step_and_the_live_views_go_alongside() -> None:
    log: list[str] = []
    derive, mark, live = Step("derive", log, 0.05), Step("mark", log, 0.0), Step("live", log, 0.02)
    batch: list[ScoreAccepted] = []
    await aggregate(derive, mark, live)(batch)
    assert log.index("derive end") < log.index("mark start")
    # The live views started before the derive step ended, and ended before it.
    assert log.index("live start") < log.index("derive end")
    assert log.index("live end") < log.index("derive end")
    assert derive.batches == mark.batches == live.batches == [batch]


async def test_a_failure_is_raised_once_every_handler_has_run_to_its_end() -> None:
    log: list[str] = []
    derive, mark = Step("derive", log, 0.05), Step("mark", log, 0.0)
    live = Step("live", log, 0.0, fails=True)
    with pytest.raises(RuntimeError, match="live failed"):
        await aggregate(derive, mark, live)([])
    # The live views failed first; the derive step and the marks still ran to their end.
    assert log.index("live end") < log.index("derive end")
    assert "mark end" in log


async def test_a_failed_derive_step_leaves_the_batch_unmarked() -> None:
    log: list[str] = []
    derive = Step("derive", log, 0.0, fails=True)
    mark, live = Step("mark", log, 0.0), Step("live", log, 0.01)
    with pytest.raises(RuntimeError, match="derive failed"):
        await aggregate(derive, mark, live)([])
    assert mark.batches == []
    assert "live end" in log
