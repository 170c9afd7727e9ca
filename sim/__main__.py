"""``python -m sim``: run the game simulation against a Ladder API."""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys

import structlog

from shared.logs import configure
from shared.settings import DEV_ADMIN_KEY, DEV_SERVER_KEY, load_settings
from shared.settings_checks import reachable_host
from sim.params import InvalidValue, SimParams, UnknownParameter, describe
from sim.poster import BoardUnavailable
from sim.runner import Config, Simulation

log = structlog.get_logger("sim")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim",
        description="Simulate a mobile game posting its scores to Ladder, in real time or N "
        "times faster. Credentials, the API's address and the broker prefix come from the "
        "LADDER_* settings; parameters can be changed while it runs with python -m sim.set.",
        epilog="parameters (NAME, default, meaning):\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--board", default="arena", help="the board to feed (created if missing)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (random if not given)")
    p.add_argument("--speed", type=float, default=None, help="simulated seconds per wall second")
    p.add_argument("--api", default=None, help="API base URL (default from LADDER_API_*)")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="start with this parameter changed (repeatable)",
    )
    p.add_argument(
        "--already-playing",
        type=int,
        default=0,
        metavar="N",
        help="players in the game from the first moment, each at the start of a session "
        "(make demo starts with 30, so the board moves at once)",
    )
    p.add_argument("--dry-run", action="store_true", help="run the model without posting")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = load_settings("sim")
    configure("sim", settings.log_level)
    # One line a batch is too many; the poster logs what goes wrong, and a summary.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    params = SimParams()
    try:
        changes = [item.partition("=")[::2] for item in args.set]
        if args.speed is not None:
            changes.append(("speed", str(args.speed)))
        for name, value in changes:
            params = params.changed(name, value)
    except (UnknownParameter, InvalidValue) as exc:
        print(f"python -m sim: {exc}", file=sys.stderr)
        return 2
    host = reachable_host(settings.api_host)
    config = Config(
        api_url=args.api or f"http://{host}:{settings.api_port}",
        board_id=args.board,
        server_key=(settings.server_keys or [DEV_SERVER_KEY])[0],
        admin_key=(settings.admin_keys or [DEV_ADMIN_KEY])[0],
        amqp_url=settings.amqp_url,
        broker_prefix=settings.broker_prefix,
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
        allowed_lateness=settings.allowed_lateness,
        duration=args.duration,
        dry_run=args.dry_run,
        already_playing=max(0, args.already_playing),
    )
    try:
        asyncio.run(Simulation(config, params).run())
    except BoardUnavailable as exc:
        log.error("cannot use the board", error=str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
