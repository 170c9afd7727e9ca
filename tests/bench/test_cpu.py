"""The bench's CPU an event: what is judged against the CPU targets in BENCHMARKS.md is Ladder's
own processes and engines, not the load generator, the bench or the rest of the machine."""

from bench import cpu


def test_the_judged_figure_leaves_out_the_load_and_the_rest_of_the_machine() -> None:
    totals = {"API": 0.5, "Redis": 0.3, "aggregator": 0.2, "other": 0.4, "the bench itself": 0.1}
    # 1,000 events: 1.0 s of Ladder's processes is 1,000 µs an event; the rest is outside.
    assert cpu.ladder_per_event(totals, 1000) == 1000
    assert cpu.per_event(totals, 1000) == (
        "1,000 µs: API 500 µs, Redis 300 µs, aggregator 200 µs;"
        " outside Ladder: other 400 µs, the bench itself 100 µs"
    )


def test_a_phase_with_nothing_outside_ladder_lists_no_outside_part() -> None:
    assert cpu.per_event({"Redis": 0.25, "API": 0.5, "wrk": 0.0}, 500) == (
        "1,500 µs: API 1,000 µs, Redis 500 µs"
    )
