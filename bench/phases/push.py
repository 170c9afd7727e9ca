"""POST-to-push latency: a WebSocket client times, from outside, a POST until its push comes."""

from __future__ import annotations

from bench import probes
from bench.phases import Bench
from bench.report import Line, Note, Row, ms


async def measure(bench: Bench) -> list[Line]:
    latencies, missed = await probes.push_latency(bench.ladder, bench.options.ws_samples)
    # A push that never came counts as slower than any that did.
    timed = latencies + [float("inf")] * missed
    p95 = probes.percentile(timed, 95)
    rows: list[Line] = [
        Row(f"POST → WebSocket push ({len(timed)} samples): p50", ms(probes.percentile(timed, 50))),
        Row("  … p95", ms(p95), "", "< 50 ms", p95 < 50),
        Row("  … max of those that came", ms(max(latencies, default=0.0))),
        Row(
            f"  … pushes that did not come within {probes.PUSH_WAIT_SECONDS:.0f} s",
            f"{missed} of {len(timed)}",
        ),
    ]
    if missed:
        rows.append(
            Note(f"{missed} pushes did not come: each is counted as slower than any that did")
        )
    return rows
