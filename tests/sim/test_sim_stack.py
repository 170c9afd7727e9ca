"""The simulation against a real Ladder, faster than real time, steered while it runs.

``python -m sim`` feeds the test's own four services at 20x; the API is stopped and started under
it (the batches it could not send go again with the same event ids: nothing lost, nothing
doubled); then ``python -m sim.set robot_share 1.0`` turns every new arrival into a robot.
Robots play four times as many rounds as humans and score the same per round on average, so they
take over the top of the global board, while the hot streaks (average per round) stay mostly
human.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.model import is_robot
from tests.stack import ROOT, Stack, run

pytestmark = pytest.mark.stack

BOARD = "arena"
# 20x real time; half the default arrivals, so the machine keeps up; a batch every half second.
SIM_ARGS = ("--speed", "20", "--set", "arrival_mean_s=4", "--set", "tick_s=0.5")


def robot_share(entries: list[dict[str, Any]]) -> float:
    return sum(is_robot(e["user_id"]) for e in entries) / len(entries) if entries else 0.0


def wait_for(probe: Any, within: float, what: str) -> Any:
    end = time.monotonic() + within
    while True:
        answer = probe()
        if answer:
            return answer
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {within} s")
        time.sleep(0.25)


@pytest.mark.timeout(150)
def test_robots_take_the_top_but_not_the_hot_streaks(stack: Stack, tmp_path: Path) -> None:
    env = stack.env
    log_path = tmp_path / "sim.log"
    with log_path.open("w") as log_file:
        sim = subprocess.Popen(
            [sys.executable, "-m", "sim", "--board", BOARD, "--seed", "7", *SIM_ARGS],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    api = httpx.Client(base_url=stack.api, timeout=10)
    try:

        def top(scope: str = "global") -> list[dict[str, Any]]:
            r = api.get(f"/v1/boards/{BOARD}/leaderboard", params={"scope": scope, "limit": 10})
            return list(r.json()["entries"]) if r.status_code == 200 else []

        def hot() -> list[dict[str, Any]]:
            return list(api.get(f"/v1/boards/{BOARD}/hot", params={"window": 60}).json()["entries"])

        # The simulation made its board and fills it: players, teams, regions.
        wait_for(lambda: len(top()) == 10, 30, "ten players on the global board")
        board = api.get(f"/v1/boards/{BOARD}").json()
        assert board["operator"] == "incr"
        assert len(top("teams")) > 0
        assert all("-" in e["team_id"] for e in top("teams"))
        assert top("region:eu") and top("region:na")

        # The API goes away for a moment under the simulation, and comes back.
        stack.make("stop", "SERVICE=api")
        time.sleep(2.0)
        stack.make("start", "SERVICE=api")
        stack.wait_ready("api")
        wait_for(lambda: len(hot()) == 10, 20, "ten hot players")
        before = robot_share(top())

        done = run([sys.executable, "-m", "sim.set", "robot_share", "1.0"], env=env, timeout=30)
        assert done.returncode == 0, done.stderr
        changed = time.monotonic()

        taken = wait_for(lambda: (s := robot_share(top())) >= 0.8 and s, 60, "robots on top")
        hot_share = robot_share(hot())
        print(
            f"robots in the global top 10: {before:.0%} before, {taken:.0%} "
            f"{time.monotonic() - changed:.1f} s after robot_share=1.0; "
            f"in the hot top 10 (60 s window) then: {hot_share:.0%}"
        )
        assert before <= 0.5
        assert hot_share <= 0.3
        assert taken - hot_share >= 0.5

        sim.send_signal(signal.SIGTERM)
        assert sim.wait(timeout=30) == 0
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
        api.close()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    messages = [line["message"] for line in lines]
    assert "board created" in messages
    assert any(m == "parameter changed" for m in messages)
    assert any(m in ("api unreachable; retrying", "api busy; retrying") for m in messages)
    final = next(line for line in lines if line["message"] == "simulation stopped")
    print("simulation at its end:", {k: final[k] for k in ("sim_time", "rounds", "accepted")})
    assert final["refused"] == 0 and final["accepted"] > 1000

    # Every score the simulation had accepted is on the board once: the retried batches
    # counted once.
    def events_counted() -> bool:
        stats = httpx.get(f"{stack.api}/v1/boards/{BOARD}/stats", params={"period": "alltime"})
        return bool(stats.json()["events"] == final["accepted"])

    # The events counter is derived by the aggregator from the stream: it trails the writes.
    wait_for(events_counted, 30, "the board's event count equal to the accepted scores")
