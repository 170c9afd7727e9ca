"""The simulation's poster against a stub API (httpx.MockTransport): it keeps posting whatever
goes wrong, and counts what the API took; and the model's counts, read while the SimPy thread
changes the game."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import simpy

from sim import poster as poster_module
from sim.model import Game
from sim.params import SimParams
from sim.poster import Poster
from sim.runner import Config, Simulation
from tests.helpers import UNREACHABLE_BROKER

BOARD = "arena"
Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poster_module, "FIRST_BACKOFF_S", 0.05)


def events(n: int) -> list[dict[str, Any]]:
    return [
        {"event_id": f"e-{i}", "user_id": f"u-{i}", "region": "eu", "value": 10} for i in range(n)
    ]


def accepted(request: httpx.Request, duplicate: bool = False) -> httpx.Response:

    batch = json.loads(request.content)["events"]
    results = [{"event_id": e["event_id"], "duplicate": duplicate} for e in batch]
    return httpx.Response(200, json={"results": results})


async def posting(handler: Handler, batch: list[dict[str, Any]]) -> Poster:
    """A poster fed ``batch`` that has sent everything it could, its task still running."""
    client = httpx.AsyncClient(
        base_url="http://ladder.test", transport=httpx.MockTransport(handler)
    )
    poster = Poster(client, BOARD, "server", "admin")
    task = asyncio.create_task(poster.run())
    try:
        poster.add(batch)
        idle = asyncio.create_task(poster.idle.wait())
        await asyncio.wait({idle, task}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        idle.cancel()
        assert not task.done(), f"the posting task ended: {task.exception()!r}"
        assert poster.idle.is_set(), "still posting after 10 s"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
    return poster


async def test_an_unexpected_error_puts_the_batch_back_and_posting_goes_on() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("something nobody expected")
        return accepted(request)

    poster = await posting(handler, events(5))
    assert calls["n"] == 2
    assert poster.accepted == 5 and poster.refused == 0 and not poster.pending


async def test_a_board_being_deleted_is_made_again_once_its_name_is_free() -> None:
    seen: list[str] = []
    board_exists = {"yes": True, "puts": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.method == "POST":
            return accepted(request) if board_exists["yes"] else httpx.Response(404)
        if request.method == "GET":
            return httpx.Response(200 if board_exists["yes"] else 404, json={"operator": "incr"})
        board_exists["puts"] += 1
        if board_exists["puts"] < 3:  # the deletion still under way
            return httpx.Response(409, json={"detail": "being deleted"})
        board_exists["yes"] = True
        return httpx.Response(201, json={})

    board_exists["yes"] = False
    poster = await posting(handler, events(3))
    assert board_exists["puts"] == 3, seen
    assert poster.accepted == 3 and poster.refused == 0


async def test_a_duplicate_answer_counts_as_accepted_and_as_a_duplicate() -> None:
    """A batch sent again whose first answer was lost: the API answers each event a duplicate,
    and each is the simulation's own event, accepted once."""
    answers = iter(["lost", "duplicate"])

    def handler(request: httpx.Request) -> httpx.Response:
        if next(answers) == "lost":
            return httpx.Response(503, headers={"Retry-After": "0.01"})
        return accepted(request, duplicate=True)

    poster = await posting(handler, events(4))
    assert poster.accepted == 4 and poster.duplicates == 4
    assert poster.summary()["accepted"] == 4


async def test_a_posting_task_that_ends_ends_the_simulation_with_its_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process then exits, and its supervisor starts it again, rather than running on with
    nothing posted."""

    async def broken(self: Poster) -> None:
        raise ValueError("posting broke")

    monkeypatch.setattr(Poster, "run", broken)
    config = Config(
        api_url="http://127.0.0.1:9",  # never called: a dry run
        board_id=BOARD,
        server_key="unused",
        admin_key="unused",
        amqp_url=UNREACHABLE_BROKER,
        broker_prefix="lt-poster",
        seed=5,
        allowed_lateness=600.0,
        duration=20.0,
        dry_run=True,
    )
    sim = Simulation(config, SimParams(speed=50.0, tick_s=0.1))
    started = time.monotonic()
    with pytest.raises(ValueError, match="posting broke"):
        await asyncio.wait_for(sim.run(), 40)
    assert time.monotonic() - started < 10


def test_robots_online_can_be_read_while_the_model_changes_the_game() -> None:
    game = Game(
        simpy.Environment(),
        SimParams(),
        seed=1,
        run_id="t",
        clock=lambda: datetime.now(UTC),
        late_cap_wall_s=0.0,
    )
    player = type("P", (), {"robot": True})()
    for i in range(2000):
        game.online[f"u-{i}"] = player
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            game.online[f"x-{i}"] = player
            game.online.pop(f"x-{i - 50}", None)
            i += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            assert game.robots_online >= 2000
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
