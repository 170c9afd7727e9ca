"""The settings each service of ``make up`` starts with: the caller's ``LADDER_*`` variables,
recorded by the Makefile and read by each service as it starts.

supervisord hands its programs the environment it was itself started with, by the first
``make up``; a later ``make restart SERVICE=...`` only asks it to start the program again. So
the Makefile records, for each service it starts or restarts, the caller's ``LADDER_*``
variables in ``$LADDER_RUN_DIR/env/<service>.json`` (mode 0600: it may hold keys and
passwords), and each program of deploy/supervisord.conf starts through ``run``, which replaces
the ``LADDER_*`` variables of supervisord's environment with the file's before it executes the
service. A file is written whole each time: a variable the caller no longer sets is gone from
it. The service then reads its settings as before (shared/settings.py): the environment first,
then ``.env`` for what the environment does not set. Where no file exists (supervisord started
by hand, or by the tests), the environment goes through unchanged. ``make down`` removes the
records with the rest of what ran.

    service_env.py write [--changed] SERVICE...   record the caller's settings for each SERVICE;
                                                  with --changed, print those whose settings
                                                  differ from what was recorded before
    service_env.py run SERVICE ARG...             exec this python with ARG... (-m services.api)
                                                  and SERVICE's recorded settings

The variables that only say where things are (``LADDER_PYTHON``, ``LADDER_ROOT``,
``LADDER_RUN_DIR``: the Makefile's, which supervisord needs) are not recorded; they come from
supervisord.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

PREFIX = "LADDER_"
PLACES = frozenset({"LADDER_PYTHON", "LADDER_ROOT", "LADDER_RUN_DIR"})


def env_dir() -> Path:
    run_dir = os.environ.get("LADDER_RUN_DIR")
    if not run_dir:
        sys.exit("service_env.py: LADDER_RUN_DIR is not set")
    return Path(run_dir) / "env"


def settings_of(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``LADDER_*`` settings of ``environ``, without the variables that say where things
    are."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(PREFIX) and name not in PLACES
    }


def recorded(service: str) -> dict[str, str] | None:
    """What was recorded for ``service``; ``None`` if nothing was."""
    path = env_dir() / f"{service}.json"
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        sys.exit(f"service_env.py: {path} is not a JSON object of strings")
    return found


def write(services: list[str], changed: bool) -> None:
    settings = settings_of(os.environ)
    directory = env_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for service in services:
        before = recorded(service)
        path = directory / f"{service}.json"
        partial = path.with_suffix(".json.partial")
        # Created 0600 before anything is written into it, then renamed over the old one.
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(settings, out, indent=1, sort_keys=True)
            out.write("\n")
        os.replace(partial, path)
        if changed and before != settings:
            print(service)


def run(service: str, args: list[str]) -> None:
    environ = dict(os.environ)
    settings = recorded(service)
    if settings is not None:
        environ = {k: v for k, v in environ.items() if k not in settings_of(environ)}
        environ.update(settings)
    # exec: the service keeps this process (supervisord's signals reach it as they did).
    os.execve(sys.executable, [sys.executable, *args], environ)


def main(argv: list[str]) -> None:
    match argv:
        case ["write", "--changed", *services] if services:
            write(services, changed=True)
        case ["write", *services] if services:
            write(services, changed=False)
        case ["run", service, *args] if args:
            run(service, args)
        case _:
            sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
