"""``python -m sim.set NAME VALUE``: change a parameter of every running simulation.

The name and value are checked before anything is published (a clear message and status 2 if
not valid); status 1 when no simulation is listening or the broker cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import aio_pika

from shared.settings import load_settings
from sim.control import NobodyListening, exchange_name, publish
from sim.params import InvalidValue, UnknownParameter, describe


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim.set",
        description="Change a parameter of every running simulation, from its next arrival or "
        "round, through the broker's control exchange (<LADDER_BROKER_PREFIX>.control).",
        epilog="parameters (NAME, default, meaning):\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME", help="a parameter, as listed below")
    p.add_argument("value", metavar="VALUE", help="its new value")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = load_settings()
    try:
        sent = asyncio.run(
            publish(settings.amqp_url, settings.broker_prefix, args.name, args.value)
        )
    except (UnknownParameter, InvalidValue) as exc:
        print(f"sim.set: {exc}", file=sys.stderr)
        return 2
    except NobodyListening as exc:
        print(f"sim.set: {exc}; nothing changed", file=sys.stderr)
        return 1
    except (OSError, aio_pika.exceptions.AMQPError) as exc:
        print(f"sim.set: broker unreachable: {exc!r}", file=sys.stderr)
        return 1
    print(f"{args.name} = {sent} sent to {exchange_name(settings.broker_prefix)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
