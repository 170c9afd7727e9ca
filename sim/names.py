"""Readable names for simulated players and teams, drawn from the simulation's seeded RNG."""

from __future__ import annotations

import random
import re
from collections.abc import Collection

ADJECTIVES = (
    "amber", "bold", "brave", "bright", "calm", "clever", "cosmic", "crimson", "daring", "dusky",
    "eager", "electric", "fierce", "frosty", "gentle", "golden", "grand", "happy", "hidden",
    "iron", "jolly", "keen", "lucky", "lunar", "mighty", "misty", "noble", "quick", "quiet",
    "rapid", "red", "royal", "rusty", "scarlet", "silent", "silver", "solar", "stormy", "swift",
    "tidal", "wild", "witty",
)  # fmt: skip
NOUNS = (
    "badgers", "bears", "comets", "condors", "coyotes", "dragons", "eagles", "falcons", "foxes",
    "geckos", "hawks", "herons", "jaguars", "koalas", "lions", "lynxes", "mantises", "marmots",
    "moose", "narwhals", "otters", "owls", "pandas", "panthers", "pumas", "ravens", "rhinos",
    "sharks", "sparrows", "tigers", "toucans", "turtles", "vipers", "walruses", "wolves",
    "wombats", "yaks",
)  # fmt: skip
FIRST_NAMES = (
    "Ada", "Ana", "Ari", "Bea", "Ben", "Cai", "Cleo", "Dev", "Eli", "Ema", "Finn", "Gus", "Ines",
    "Ivo", "Jin", "Kai", "Lea", "Leo", "Lina", "Luca", "Mia", "Milo", "Nia", "Noor", "Oli",
    "Pia", "Raj", "Rio", "Sam", "Sol", "Tara", "Teo", "Uma", "Vic", "Yara", "Zoe",
)  # fmt: skip

TEAM_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


def team_name(rng: random.Random, taken: Collection[str]) -> str:
    """An adjective-noun name, unique among ``taken`` (a number is added once every pair of the
    draw is in use); always a valid ``team_id``."""
    for _ in range(20):
        name = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        if name not in taken:
            return name
    base = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def player_name(rng: random.Random, number: int) -> str:
    return f"{rng.choice(FIRST_NAMES)} {number}"
