"""``make bench``: Ladder's benchmarks, each figure next to a baseline measured in the same run.

The machine these run on is shared and noisy, so every claim is a ratio: Ladder's single-event and
batch throughput against a bare Redis write loop (``redis_loop``) and a bare uvicorn endpoint
(``bare``) loaded by the same tool (wrk) in the same minute. ``python -m bench`` runs them all
against the Ladder that ``make up`` runs, on bench-only boards (``bench-*``), a bench-only key
prefix and a bench-only database, removes what it wrote, prints the table and writes
``BENCHMARKS.md``.
"""
