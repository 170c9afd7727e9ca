"""The consumers' metrics (shared/consumer.py), and their series made at a consumer's start.

A labelled counter has no series until its first count, so an alert on its rise
(docs/operations.md, "The metrics that matter") would miss that first count, and a dashboard
would show no line at all where the healthy value is a flat 0.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

MESSAGES = Counter("ladder_consumer_messages_total", "Messages taken", ["consumer", "outcome"])
EVENTS = Counter("ladder_consumer_events_total", "Events handed to the handler", ["consumer"])
BATCH_SECONDS = Histogram("ladder_consumer_batch_seconds", "Handler time a batch", ["consumer"])
RETRIES = Counter("ladder_consumer_handler_failures_total", "Handler failures", ["consumer"])
EVENTS_REFUSED = Counter(
    "ladder_consumer_events_refused_total",
    "Events refused: by the handler (not an outage; their messages go back toward the delivery"
    " limit), or by the schema (their messages dead-lettered once their other events are handled)",
    ["consumer", "reason"],
)
CONNECTED = Gauge("ladder_consumer_connected", "1 while consuming", ["consumer"])

OUTCOMES = ("ok", "refused", "dead-lettered", "poison", "poison-split")
REASONS = ("handler", "schema")


def series_from_start(consumer: str) -> None:
    """Every series of ``consumer``, at 0 (not connected) until it counts or connects."""
    CONNECTED.labels(consumer).set(0)
    EVENTS.labels(consumer)
    RETRIES.labels(consumer)
    for outcome in OUTCOMES:
        MESSAGES.labels(consumer, outcome)
    for reason in REASONS:
        EVENTS_REFUSED.labels(consumer, reason)
