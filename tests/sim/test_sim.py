"""The game simulation: its distributions, teams, late scores and live control.

The model runs on a plain SimPy environment (no waiting) for hours of simulated time with a fixed
seed; live control runs a real-time simulation (without posting) against the test's own control
exchange on the real broker.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest
import simpy

from shared.amqp import connect as connect_broker
from shared.settings import LadderSettings
from sim.control import Listener, NobodyListening, exchange_name, publish
from sim.model import REGIONS, Game, Score, is_robot
from sim.names import TEAM_ID, team_name
from sim.params import InvalidValue, SimParams, UnknownParameter, lognormal_mu_sigma
from sim.runner import Config, Simulation
from tests.helpers import eventually

START = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
HOURS = 4 * 3600.0


def run_game(
    params: SimParams, until: float = HOURS, seed: int = 7, already_playing: int = 0
) -> Game:
    env = simpy.Environment()
    game = Game(
        env,
        params,
        seed=seed,
        run_id="test",
        clock=lambda: START + timedelta(seconds=env.now),
        late_cap_wall_s=540.0,
        keep=True,
    )
    game.start(already_playing)
    env.run(until=until)
    return game


@pytest.fixture(scope="module")
def game(watched: tuple[Game, list[str]]) -> Game:
    """Four hours of the default game, with everything that happened in it."""
    return watched[0]


@pytest.fixture(scope="module")
def watched() -> tuple[Game, list[str]]:
    """A game checked every simulated second: team sizes, names, who is in a team."""
    env = simpy.Environment()
    game = Game(
        env,
        SimParams(),
        seed=3,
        run_id="teams",
        clock=lambda: START + timedelta(seconds=env.now),
        late_cap_wall_s=540.0,
        keep=True,
    )
    violations: list[str] = []

    def watch() -> simpy.events.ProcessGenerator:
        while True:
            yield env.timeout(1.0)
            live = list(game.teams.values())
            if len({t.team_id for t in live}) != len(live):
                violations.append(f"{env.now}: two live teams share a name")
            for team in live:
                if not 1 <= len(team.members) <= 15:
                    violations.append(f"{env.now}: {team.team_id} has {len(team.members)}")
            online_in_teams = sum(len(t.members) for t in live)
            if online_in_teams != len(game.online):
                violations.append(f"{env.now}: {online_in_teams} in teams, {len(game.online)} on")

    env.process(watch())
    game.start()
    env.run(until=HOURS)
    return game, violations


def round_gaps(game: Game, robots: bool) -> list[float]:
    """Each round's length: the time from the player's previous round (or arrival) to its end."""
    starts = {p.user_id: p.arrived_at for p in game.players}
    gaps = []
    for score in sorted(game.scores, key=lambda s: s.earned_at):
        if score.robot == robots:
            gaps.append(score.earned_at - starts[score.user_id])
            starts[score.user_id] = score.earned_at
    return gaps


def test_lognormal_parameters_give_the_asked_mean_and_sd() -> None:
    mu, sigma = lognormal_mu_sigma(300.0, 120.0)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(300.0)
    assert math.sqrt((math.exp(sigma**2) - 1) * math.exp(2 * mu + sigma**2)) == pytest.approx(120.0)
    rng = random.Random(1)
    draws = [rng.lognormvariate(mu, sigma) for _ in range(50_000)]
    assert statistics.fmean(draws) == pytest.approx(300.0, rel=0.02)
    assert statistics.stdev(draws) == pytest.approx(120.0, rel=0.04)


def test_players_arrive_as_a_poisson_process(game: Game) -> None:
    gaps = [b - a for a, b in zip(game.arrivals, game.arrivals[1:], strict=False)]
    assert len(gaps) > 7000
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(2.0, rel=0.04)
    # Exponential gaps: sd equals the mean, and e^-1 of them are longer than the mean.
    assert statistics.stdev(gaps) / mean == pytest.approx(1.0, abs=0.05)
    assert sum(g > mean for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.02)
    # Arrivals per minute: Poisson, variance equal to the mean.
    per_minute = defaultdict(int)
    for t in game.arrivals:
        per_minute[int(t // 60)] += 1
    counts = [per_minute[m] for m in range(int(HOURS // 60))]
    assert statistics.fmean(counts) == pytest.approx(30.0, rel=0.05)
    assert statistics.variance(counts) / statistics.fmean(counts) == pytest.approx(1.0, abs=0.25)


def test_sessions_are_lognormal_with_mean_300_and_sd_120(game: Game) -> None:
    sessions = [p.session_s for p in game.players]
    assert statistics.fmean(sessions) == pytest.approx(300.0, rel=0.03)
    assert statistics.stdev(sessions) == pytest.approx(120.0, rel=0.08)
    mu, sigma = lognormal_mu_sigma(300.0, 120.0)
    logs = [math.log(s) for s in sessions]
    assert statistics.fmean(logs) == pytest.approx(mu, abs=0.01)
    assert statistics.stdev(logs) == pytest.approx(sigma, rel=0.04)
    # Everyone who left stayed exactly their session.
    left = [p for p in game.players if p.left_at is not None]
    assert len(left) > 0.9 * len(game.players)
    assert all(p.left_at == pytest.approx(p.arrived_at + p.session_s) for p in left)


def test_human_rounds_are_lognormal_and_score_within_bounds(game: Game) -> None:
    gaps = round_gaps(game, robots=False)
    assert len(gaps) > 100_000
    # A round that would outlast the session is not started, which shortens the kept ones a
    # little; the mean and sd stay within a few percent of 6 s and 2 s.
    assert statistics.fmean(gaps) == pytest.approx(6.0, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(2.0, rel=0.06)
    values = [s.value for s in game.scores if not s.robot]
    assert all(isinstance(v, int) and 0 <= v <= 20 for v in values)
    assert min(values) == 0 and max(values) == 20
    # Skill is Beta(2, 2), mean 0.5: the average round scores 10.
    assert statistics.fmean(values) == pytest.approx(10.0, rel=0.05)


def test_robots_are_five_percent_and_play_every_1_5_s(game: Game) -> None:
    robots = [p for p in game.players if p.robot]
    share = len(robots) / len(game.players)
    assert share == pytest.approx(0.05, abs=0.01)
    assert all(is_robot(p.user_id) for p in robots)
    assert not any(is_robot(p.user_id) for p in game.players if not p.robot)
    gaps = round_gaps(game, robots=True)
    assert statistics.fmean(gaps) == pytest.approx(1.5, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.3, rel=0.1)
    # Same average score as a human, four times the rounds: robots win totals, not averages.
    robot_values = [s.value for s in game.scores if s.robot]
    assert statistics.fmean(robot_values) == pytest.approx(10.0, rel=0.05)
    rounds_per_robot = statistics.fmean(p.rounds / p.session_s for p in robots)
    rounds_per_human = statistics.fmean(p.rounds / p.session_s for p in game.players if not p.robot)
    assert rounds_per_robot / rounds_per_human == pytest.approx(4.0, rel=0.1)


def test_regions_follow_their_weights(game: Game) -> None:
    counts = defaultdict(int)
    for p in game.players:
        counts[p.region] += 1
    for region, weight in REGIONS:
        assert counts[region] / len(game.players) == pytest.approx(weight, abs=0.02)


def test_teams_hold_at_most_15_dissolve_when_empty_and_have_unique_names(
    watched: tuple[Game, list[str]],
) -> None:
    game, violations = watched
    assert violations == []
    teams_seen = {p.team.team_id for p in game.players}
    assert all(TEAM_ID.match(t) for t in teams_seen)
    assert all("-" in t and t.split("-")[0].isalpha() for t in teams_seen)
    # Full teams happen (so capacity is what stopped them), and never beyond 15.
    peaks = [p.team.peak for p in game.players]
    assert max(peaks) == 15
    # About one arrival in ten forms a team; more when every team is full.
    assert 0.085 <= game.teams_formed / game.players_made <= 0.2
    # Teams dissolved when their last member left, and only then.
    assert game.teams_dissolved == len(game.dissolved) > 100
    for team in game.dissolved:
        assert team.members == set()
        assert team.dissolved_at == max(
            p.left_at for p in game.players if p.team is team and p.left_at is not None
        )
    # Every score names the team its player was in.
    teams_of = {p.user_id: p.team.team_id for p in game.players}
    assert all(s.team_id == teams_of[s.user_id] for s in game.scores)


def test_team_names_stay_unique_when_every_pair_is_taken() -> None:
    rng = random.Random(5)
    taken: set[str] = set()
    for _ in range(3000):
        name = team_name(rng, taken)
        assert name not in taken and TEAM_ID.match(name)
        taken.add(name)


def test_one_percent_of_scores_are_late_with_their_own_time(
    watched: tuple[Game, list[str]],
) -> None:
    game, _ = watched
    late = [s for s in game.scores if s.late]
    assert len(late) / len(game.scores) == pytest.approx(0.01, abs=0.002)
    delays = [s.send_at - s.earned_at for s in late]
    assert all(0 < d <= 540.0 + 1e-6 for d in delays)
    # Exponential, mean 120 s, cut at the cap: its mean is 120 (1 - e^-4.5).
    assert statistics.fmean(delays) == pytest.approx(120 * (1 - math.exp(-4.5)), rel=0.15)
    for s in game.scores:
        assert s.occurred_at == START + timedelta(seconds=s.earned_at)
        assert s.body()["occurred_at"] == s.occurred_at.isoformat().replace("+00:00", "Z")


def test_late_scores_are_handed_out_only_when_due() -> None:
    env = simpy.Environment()
    params = SimParams(late_share=0.5, late_delay_mean_s=60.0)
    game = Game(env, params, seed=2, run_id="late", clock=lambda: START, late_cap_wall_s=540.0)
    handed: list[tuple[float, Score]] = []

    def tick() -> simpy.events.ProcessGenerator:
        while True:
            yield env.timeout(1.0)
            handed.extend((env.now, s) for s in game.take_due())

    env.process(tick())
    game.start()
    env.run(until=3600)
    late = [(t, s) for t, s in handed if s.late]
    on_time = [(t, s) for t, s in handed if not s.late]
    assert len(late) > 100 and len(on_time) > 100
    assert all(s.send_at <= t < s.send_at + 1.0 for t, s in late)
    assert all(s.earned_at <= t < s.earned_at + 1.0 for t, s in on_time)
    assert len({s.event_id for _, s in handed}) == len(handed)


def test_the_late_delay_never_passes_the_allowed_lateness_at_any_speed() -> None:
    params = SimParams(late_share=1.0, late_delay_mean_s=3000.0, speed=0.5)
    game = run_game(params, until=1800, seed=4)
    # At half speed a simulated second takes two wall seconds: the cap is 540 wall seconds.
    assert max(s.send_at - s.earned_at for s in game.scores) <= 540.0 * 0.5 + 1e-6


def test_a_seed_replays_the_same_game() -> None:
    first = run_game(SimParams(), until=600, seed=21)
    second = run_game(SimParams(), until=600, seed=21)
    other = run_game(SimParams(), until=600, seed=22)
    body = [s.body() for s in first.scores]
    assert body == [s.body() for s in second.scores]
    assert body != [s.body() for s in other.scores]


def test_parameters_are_checked_by_name_and_value() -> None:
    params = SimParams()
    assert params.changed("robot_share", "1.0").robot_share == 1.0
    assert params.changed("team_max", "4").team_max == 4
    with pytest.raises(UnknownParameter, match="robo_share"):
        params.changed("robo_share", "1")
    for name, value in (("robot_share", "1.5"), ("team_max", "2.5"), ("speed", "0"),
                        ("speed", "nan"), ("score_max", "many")):  # fmt: skip
        with pytest.raises(InvalidValue, match=name):
            params.changed(name, value)


def dry_run(settings: LadderSettings, seed: int) -> Config:
    """A simulation that keeps its records and posts nothing, on the test's broker."""
    return Config(
        api_url="http://127.0.0.1:9",  # never called: the run does not post
        board_id="arena",
        server_key="unused",
        admin_key="unused",
        amqp_url=settings.amqp_url,
        broker_prefix=settings.broker_prefix,
        seed=seed,
        allowed_lateness=600.0,
        dry_run=True,
        keep_records=True,
    )


@pytest.mark.timing
async def test_a_change_reaches_a_running_simulation_and_applies_from_the_next_round(
    settings: LadderSettings,
) -> None:
    sim = Simulation(dry_run(settings, 5), SimParams(speed=50.0, tick_s=0.1, arrival_mean_s=0.5))
    running = asyncio.create_task(sim.run())
    try:
        await asyncio.wait_for(sim.listener.bound.wait(), 10)
        game = sim.game
        await eventually(lambda: _true(game.rounds > 200), within=20)
        version = game.params_version
        assert await publish(settings.amqp_url, settings.broker_prefix, "score_max", "1") == 1
        await eventually(lambda: _true(game.params.score_max == 1), within=10)
        changed_at = game.env.now
        assert game.params_version == version + 1
        rounds_at_change = game.rounds
        await eventually(lambda: _true(game.rounds > rounds_at_change + 300), within=20)
        # A new speed re-times the real-time clock from the next tick on.
        await publish(settings.amqp_url, settings.broker_prefix, "speed", "80")
        await eventually(lambda: _true(sim.env.factor == pytest.approx(1 / 80)), within=10)
        sim_start, wall_start = game.env.now, time.monotonic()
        await asyncio.sleep(1.0)
        rate = (game.env.now - sim_start) / (time.monotonic() - wall_start)
        assert 40 <= rate <= 100, rate
        sim.request_stop()
        await asyncio.wait_for(running, 30)
    finally:
        sim.request_stop()
        await asyncio.wait_for(running, 30)
    # The control exchange went with the last simulation bound to it.
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await channel.declare_exchange(exchange_name(settings.broker_prefix), passive=True)
    before = [s for s in game.scores if s.params_version <= version]
    after = [s for s in game.scores if s.params_version > version]
    assert len(after) > 100
    # Rounds begun before the change keep the old range; every round after it has the new one.
    assert max(s.value for s in before) > 1
    assert all(s.value <= 1 for s in after)
    assert {s.value for s in after} == {0, 1}
    # Rounds already under way at the change ended after it, under the parameters they began with.
    assert any(s.earned_at > changed_at and s.value > 1 for s in before)
    assert sim._poster is not None and 0 < sim._poster.accepted <= len(game.scores)


async def test_a_change_with_nobody_listening_is_reported(settings: LadderSettings) -> None:
    with pytest.raises(NobodyListening):
        await publish(settings.amqp_url, settings.broker_prefix, "robot_share", "0.5")
    with pytest.raises(InvalidValue):
        await publish(settings.amqp_url, settings.broker_prefix, "robot_share", "5")
    # Publishing made no exchange.
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await channel.declare_exchange(exchange_name(settings.broker_prefix), passive=True)


async def _true(value: bool) -> bool:
    return value


async def test_a_control_exchange_made_durable_beforehand_is_used_as_it_is(
    settings: LadderSettings,
) -> None:
    """An operator's durable exchange of the same name: the simulation binds to it instead of
    failing to declare it with other arguments, and a change reaches it."""
    name = exchange_name(settings.broker_prefix)
    connection = await connect_broker(settings.amqp_urls)
    async with connection:
        channel = await connection.channel()
        await channel.declare_exchange(name, aio_pika.ExchangeType.FANOUT, durable=True)
        try:
            changes: list[tuple[str, object]] = []
            listener = Listener(
                settings.amqp_url,
                settings.broker_prefix,
                lambda key, value: changes.append((key, value)),
            )
            running = asyncio.create_task(listener.run())
            try:
                await asyncio.wait_for(listener.bound.wait(), 10)
                await publish(settings.amqp_url, settings.broker_prefix, "robot_share", "0.25")

                async def applied() -> bool:
                    return changes == [("robot_share", 0.25)]

                await eventually(applied)
            finally:
                listener.stop()
                await asyncio.wait_for(running, 10)
        finally:
            await channel.exchange_delete(name)


def test_a_game_can_start_with_players_already_in_it() -> None:
    """`--already-playing N` (make demo: 30): N sessions from the first moment, so the first
    scores come within the first rounds instead of after the first arrivals' rounds."""
    warm = run_game(SimParams(), until=5.0, seed=3, already_playing=30)
    cold = run_game(SimParams(), until=5.0, seed=3)
    assert sum(1 for a in warm.arrivals if a == 0.0) == 30
    assert not any(a == 0.0 for a in cold.arrivals)
    # Rounds of mean 6 s, sd 2 s: of 30 players, some finish one within 5 s.
    assert len(warm.scores) >= 3
    assert len(cold.scores) <= 1
    assert all(len(t.members) <= SimParams().team_max for t in warm.teams.values())


async def test_a_stop_sends_the_late_scores_still_held_back(settings: LadderSettings) -> None:
    """Every score is late here, each held back about a minute of game time: a stop sends those
    still held, with the time each was earned, rather than dropping them (a stopped run left
    24 unsent, against the guide's "it sends what it holds")."""
    params = SimParams(speed=20.0, tick_s=0.1, arrival_mean_s=0.5, late_share=1.0)
    sim = Simulation(dry_run(settings, 11), params.model_copy(update={"late_delay_mean_s": 60.0}))
    running = asyncio.create_task(sim.run())
    try:
        await asyncio.wait_for(sim.listener.bound.wait(), 10)
        await eventually(lambda: _true(len(sim.game.scores) > 50), within=20)
    finally:
        sim.request_stop()
        await asyncio.wait_for(running, 30)
    assert sim.game.summary()["late_pending"] == 0
    assert sim._poster is not None and sim._poster.accepted == len(sim.game.scores)
