"""The game, as SimPy processes: players arrive, join teams, play rounds and leave.

- Players arrive as a Poisson process (exponential gaps of mean ``arrival_mean_s``).
- A session lasts a lognormal time (``session_mean_s``, ``session_sd_s``); a human's round a
  lognormal time (``round_mean_s``, ``round_sd_s``), a robot's a normal one (``robot_round_s``,
  ``robot_round_sd_s``). A round that would outlast the session is not started.
- A round is played under the parameters in force when it begins. It scores
  Binomial(``score_max``, skill): a human's skill is drawn from Beta(a, a) with
  a = ``skill_spread``, a robot's is ``robot_skill``. Robots play far more rounds, not better
  ones: they climb the totals, not the averages.
- An arriving player joins a random team with room (fewer than ``team_max`` members) or, with
  ``new_team_chance`` or when none has room, forms a new one; it leaves the team at the end of its
  session, and a team nobody is left in dissolves.
- A ``late_share`` of scores is held back an exponential delay of mean ``late_delay_mean_s``
  (never past the lateness the API allows) and sent with the time it was earned.

Every draw reads the parameters in force at that moment, so a change applies from the next
arrival or round. The model only produces scores; :mod:`sim.runner` posts them.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import simpy

from sim.names import player_name, team_name
from sim.params import SimParams, lognormal_mu_sigma

# A handful of regions, weighted as a game's players might be spread.
REGIONS: tuple[tuple[str, float], ...] = (
    ("eu", 0.35),
    ("na", 0.30),
    ("asia", 0.20),
    ("sa", 0.10),
    ("oce", 0.05),
)
ROBOT_PREFIX = "bot-"
HUMAN_PREFIX = "player-"
MIN_ROUND_S = 0.1


@dataclass(frozen=True, slots=True)
class Score:
    """One round's result, as it will be posted."""

    event_id: str
    user_id: str
    display_name: str
    region: str
    team_id: str
    value: int
    robot: bool
    earned_at: float  # simulated time
    occurred_at: datetime  # wall-clock time it was earned
    send_at: float  # simulated time it is due to be sent (later than earned_at when late)
    params_version: int  # which parameters were in force when the round began

    @property
    def late(self) -> bool:
        return self.send_at > self.earned_at

    def body(self) -> dict[str, Any]:
        """The event as the batch endpoint takes it."""
        return {
            "event_id": self.event_id,
            "user_id": self.user_id,
            "display_name": self.display_name,
            "region": self.region,
            "team_id": self.team_id,
            "value": self.value,
            "occurred_at": self.occurred_at.isoformat().replace("+00:00", "Z"),
        }


@dataclass(slots=True)
class Team:
    team_id: str
    formed_at: float
    members: set[str] = field(default_factory=set)
    dissolved_at: float | None = None
    peak: int = 0


@dataclass(slots=True)
class Player:
    user_id: str
    display_name: str
    region: str
    robot: bool
    skill: float
    arrived_at: float
    session_s: float
    team: Team
    rounds: int = 0
    left_at: float | None = None


class Game:
    """The simulated game on a SimPy environment (real-time or not)."""

    def __init__(
        self,
        env: simpy.Environment,
        params: SimParams,
        *,
        seed: int,
        run_id: str,
        clock: Callable[[], datetime],
        late_cap_wall_s: float,
        keep: bool = False,
    ) -> None:
        self.env = env
        self._params = params
        self.params_version = 0
        self.rng = random.Random(seed)
        self.run_id = run_id
        self.clock = clock
        self.late_cap_wall_s = late_cap_wall_s
        self.keep = keep
        self.teams: dict[str, Team] = {}
        self.online: dict[str, Player] = {}
        self.players_made = 0
        self.rounds = 0
        self.late_sent = 0
        self.teams_formed = 0
        self.teams_dissolved = 0
        self._seq = 0
        self._ready: list[Score] = []
        self._late: list[tuple[float, int, Score]] = []
        # Kept only when asked (tests): everything that happened.
        self.arrivals: list[float] = []
        self.players: list[Player] = []
        self.scores: list[Score] = []
        self.dissolved: list[Team] = []

    # -- parameters ------------------------------------------------------------------------------
    @property
    def params(self) -> SimParams:
        return self._params

    @params.setter
    def params(self, value: SimParams) -> None:
        # One reference swap: a draw sees either the old parameters or the new ones.
        self._params = value
        self.params_version += 1

    # -- processes -------------------------------------------------------------------------------
    def start(self, already_playing: int = 0) -> None:
        """Start the arrivals; ``already_playing`` players are in the game from the first moment
        (a game that was running before the simulation started, rather than an empty one)."""
        for _ in range(already_playing):
            self.env.process(self._session(self._arrive()))
        self.env.process(self._arrivals())

    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        while True:
            yield self.env.timeout(self.rng.expovariate(1.0 / self.params.arrival_mean_s))
            self.env.process(self._session(self._arrive()))

    def _arrive(self) -> Player:
        p, rng, now = self.params, self.rng, self.env.now
        self.players_made += 1
        number = self.players_made
        robot = rng.random() < p.robot_share
        mu, sigma = lognormal_mu_sigma(p.session_mean_s, p.session_sd_s)
        region = rng.choices([r for r, _ in REGIONS], weights=[w for _, w in REGIONS])[0]
        if robot:
            user_id, name, skill = f"{ROBOT_PREFIX}{number:06d}", f"Bot {number}", p.robot_skill
        else:
            user_id = f"{HUMAN_PREFIX}{number:06d}"
            name = player_name(rng, number)
            skill = rng.betavariate(p.skill_spread, p.skill_spread)
        player = Player(
            user_id=user_id,
            display_name=name,
            region=region,
            robot=robot,
            skill=skill,
            arrived_at=now,
            session_s=rng.lognormvariate(mu, sigma),
            team=self._join(),
        )
        player.team.members.add(user_id)
        player.team.peak = max(player.team.peak, len(player.team.members))
        self.online[user_id] = player
        if self.keep:
            self.arrivals.append(now)
            self.players.append(player)
        return player

    def _join(self) -> Team:
        p = self.params
        with_room = [t for t in self.teams.values() if len(t.members) < p.team_max]
        if with_room and self.rng.random() >= p.new_team_chance:
            return self.rng.choice(with_room)
        team = Team(team_name(self.rng, self.teams.keys()), formed_at=self.env.now)
        self.teams[team.team_id] = team
        self.teams_formed += 1
        return team

    def _session(self, player: Player) -> Generator[simpy.Event, Any, None]:
        end = player.arrived_at + player.session_s
        while True:
            # A round is played under the parameters in force when it begins.
            params, version = self.params, self.params_version
            length = self._round_length(player, params)
            if self.env.now + length > end:
                break
            yield self.env.timeout(length)
            self._score(player, params, version)
        yield self.env.timeout(max(0.0, end - self.env.now))
        self._leave(player)

    def _round_length(self, player: Player, p: SimParams) -> float:
        if player.robot:
            return max(MIN_ROUND_S, self.rng.normalvariate(p.robot_round_s, p.robot_round_sd_s))
        mu, sigma = lognormal_mu_sigma(p.round_mean_s, p.round_sd_s)
        return max(MIN_ROUND_S, self.rng.lognormvariate(mu, sigma))

    def _score(self, player: Player, p: SimParams, version: int) -> None:
        rng, now = self.rng, self.env.now
        value = sum(1 for _ in range(p.score_max) if rng.random() < player.skill)
        send_at = now
        if rng.random() < p.late_share:
            cap = self.late_cap_wall_s * p.speed
            delay = rng.expovariate(1.0 / p.late_delay_mean_s) if p.late_delay_mean_s else 0.0
            send_at = now + min(delay, cap)
        self._seq += 1
        score = Score(
            event_id=f"{self.run_id}-{self._seq}",
            user_id=player.user_id,
            display_name=player.display_name,
            region=player.region,
            team_id=player.team.team_id,
            value=value,
            robot=player.robot,
            earned_at=now,
            occurred_at=self.clock(),
            send_at=send_at,
            params_version=version,
        )
        player.rounds += 1
        self.rounds += 1
        if score.late:
            self.late_sent += 1
            heapq.heappush(self._late, (send_at, self._seq, score))
        else:
            self._ready.append(score)
        if self.keep:
            self.scores.append(score)

    def _leave(self, player: Player) -> None:
        player.left_at = self.env.now
        del self.online[player.user_id]
        team = player.team
        team.members.discard(player.user_id)
        if not team.members:
            team.dissolved_at = self.env.now
            del self.teams[team.team_id]
            self.teams_dissolved += 1
            if self.keep:
                self.dissolved.append(team)

    # -- output ----------------------------------------------------------------------------------
    def take_due(self) -> list[Score]:
        """Scores due to be sent by now: this tick's, and late ones whose delay has passed."""
        due, self._ready = self._ready, []
        now = self.env.now
        while self._late and self._late[0][0] <= now:
            due.append(heapq.heappop(self._late)[2])
        return due

    def take_held(self) -> list[Score]:
        """At the stop, once the model has ended: every score not handed out yet, the late ones
        held back included (sooner than their delay, still with the time each was earned), so
        that a stop sends what the game made rather than dropping it."""
        held, self._ready = self._ready, []
        held += [score for _, _, score in sorted(self._late)]
        self._late = []
        return held

    @property
    def robots_online(self) -> int:
        # Read from the asyncio side while the SimPy thread adds and removes players: a copy
        # (made in one step, under the GIL) is iterated, not the dict itself.
        return sum(1 for p in list(self.online.values()) if p.robot)

    def summary(self) -> dict[str, Any]:
        return {
            "sim_time": round(self.env.now, 1),
            "online": len(self.online),
            "robots_online": self.robots_online,
            "teams": len(self.teams),
            "rounds": self.rounds,
            "late": self.late_sent,
            "late_pending": len(self._late),
        }


def is_robot(user_id: str) -> bool:
    return user_id.startswith(ROBOT_PREFIX)
