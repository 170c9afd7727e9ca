"""The bench's own settings, ``BENCH_*``, read once at its entry point (the environment its wrk
runs are started with is :func:`shared.settings.child_environment`).

``BENCH_SECONDS`` (each load phase, default 15), ``BENCH_OUT`` (default ``BENCHMARKS.md`` at the
repository's root), ``BENCH_WS_SAMPLES`` (default 200), ``BENCH_MEMBERS`` (default 1,000,000).
The Ladder under test is described by its own ``LADDER_*`` settings (shared/settings.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parent.parent


class BenchSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BENCH_", frozen=True)

    seconds: float = 15.0
    members: int = 1_000_000
    ws_samples: int = 200
    out: Path = ROOT / "BENCHMARKS.md"
