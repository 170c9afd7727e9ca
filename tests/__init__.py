"""Ladder's tests, in folders that mirror the source.

- ``api/``, ``aggregator/``, ``history/``, ``notifier/``, ``rebuild/``, ``shared/``, ``sim/``:
  what each package does, against real Redis, RabbitMQ and MySQL on loopback.
- ``deploy/``: the container deployment; ``scripts/``: ``make clean``.
- ``e2e/``: the four services running together as processes (a score's whole way, stop and
  start, redelivery, SIGTERM under load, the dashboard in a browser).
- ``faults/``: faults injected under load on private servers (``make test-faults``).

``conftest.py`` isolates every test (its own key prefix, broker prefix and database),
``helpers.py`` holds what tests of several folders share, and ``stack.py`` is the one launcher of
processes: commands, waits, free ports and a whole Ladder for one test.
"""
