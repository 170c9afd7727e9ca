"""Every metric Ladder's services serve is named in docs/operations.md with its labels, so an
operator reading the list finds each series ``/metrics`` gives (docs/api.md section 10)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

# Each service's modules, so that every metric of Ladder is registered in this process.
import services.aggregator.main
import services.api.app
import services.history.main
import services.notifier.main
from shared.consumer import ConsumerRunner
from shared.settings import LadderSettings
from shared.topology import Topology
from tests.api.helpers import SCORES, score
from tests.helpers import SERVER, UNREACHABLE_BROKER, api_client, eventually

pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

MODULES = (
    services.aggregator.main,
    services.api.app,
    services.history.main,
    services.notifier.main,
)
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _ladder_metrics() -> dict[str, set[str]]:
    """Each of Ladder's metrics by the name of its series (``_total`` for a counter), with the
    names of its labels."""
    found: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("ladder_"):
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "pid")}
        labels |= set(getattr(REGISTRY._names_to_collectors.get(name), "_labelnames", ()))
        found[name] = labels
    return found


def test_every_metric_is_listed_with_its_labels_in_the_operations_guide() -> None:
    assert all(m.__name__ for m in MODULES)
    text = OPERATIONS.read_text()
    metrics = _ladder_metrics()
    assert len(metrics) >= 40
    missing = sorted(name for name in metrics if not re.search(rf"`{name}[`{{]", text))
    unlabelled = sorted(
        f"{name}{{{label}}}"
        for name, labels in metrics.items()
        for label in labels
        if not re.search(rf"`{name}\{{[^}}`]*\b{label}\b", text)
    )
    assert missing == [], "metrics not listed in docs/operations.md"
    assert unlabelled == [], "labels not given in docs/operations.md"


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_client_input_adds_no_series_and_counters_only_grow(
    quiet: LadderSettings, redis: Redis
) -> None:
    async with api_client(quiet) as client:
        await client.post(SCORES, json=score(event_id="c-1"), headers=SERVER)
        before = _series((await client.get("/metrics")).text)
        for n in range(300):
            await client.get(f"/no/such/path/{n}?q={n}")
            await client.get(f"/v1/boards/nope-{n}/leaderboard")
            await client.post(f"/v1/boards/nope-{n}/scores", json=score(), headers=SERVER)
            await client.get(f"/v1/boards/main/users/u-{n}")
        await client.post(SCORES, json=score(event_id="c-2"), headers=SERVER)
        after = _series((await client.get("/metrics")).text)

    added = {name for name, _ in after.keys() - before.keys()}
    # The only series a run of the API makes later are its own, of a fixed set of labels.
    assert all(not name.startswith("ladder_api") for name in added), added
    assert len(after) - len(before) <= 4, added
    counters = [key for key in before if key[0].endswith("_total")]
    assert counters
    assert all(after[key] >= before[key] for key in counters)
    accepted = ("ladder_api_scores_total", (("outcome", "accepted"),))
    assert after[accepted] == before[accepted] + 1


# The labelled counters the operations guide alerts on a rise of, each with its label values.
ALERTED = {
    "ladder_api_rate_limited_total": ("bucket", ("user", "key")),
    "ladder_relay_failures_total": ("stage", ("connect", "publish")),
    "ladder_ws_turned_away_total": ("cap", ("address", "process")),
    "ladder_periods_publish_failures_total": ("stage", ("connect", "publish")),
    # Not alerted on, but of a fixed set of label values too: a dashboard's flat 0.
    "ladder_history_events_total": ("outcome", ("inserted", "duplicate")),
    "ladder_aggregator_live_events_total": ("view", ("hot", "mvps")),
    "ladder_aggregator_live_pushes_total": ("view", ("hot", "mvps")),
    "ladder_aggregator_rank_pushes_total": ("reason", ("entered_top", "overtaken")),
    "ladder_notifier_pushes_total": ("reason", ("entered_top", "overtaken")),
}
CONSUMER_ALERTED = {
    "ladder_consumer_handler_failures_total": {()},
    "ladder_consumer_messages_total": {
        (("outcome", o),) for o in ("dead-lettered", "poison", "poison-split")
    },
}


async def test_every_series_alerted_on_is_there_from_the_start(
    settings: LadderSettings, broker: Topology
) -> None:
    """A labelled counter has no series until its first count: an alert on its rise missed that
    count, and a dashboard showed nothing where a flat 0 was healthy (three of the guide's
    alerting counters were absent from a fresh API's /metrics). The services' and a consumer's
    series are there before any count; the consumer's while its broker is away."""
    assert all(m.__name__ for m in MODULES)
    series = _series(generate_latest(REGISTRY).decode())
    for name, (label, values) in ALERTED.items():
        assert {(name, ((label, v),)) for v in values} <= series.keys(), name

    runner = ConsumerRunner(
        name="audit-start", amqp_url=UNREACHABLE_BROKER, topology=broker, handler=_nothing
    )
    running = asyncio.create_task(runner.run())

    def made() -> bool:
        found = _series(generate_latest(REGISTRY).decode())
        wanted = {
            (name, tuple(sorted((("consumer", "audit-start"), *labels))))
            for name, labelsets in CONSUMER_ALERTED.items()
            for labels in labelsets
        }
        return wanted <= found.keys()

    try:
        assert await eventually(lambda: asyncio.sleep(0, made()), within=5)
    finally:
        runner.stop()
        await asyncio.wait_for(running, 10)


async def _nothing(events: list[Any]) -> None:
    return None
