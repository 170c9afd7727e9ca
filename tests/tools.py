"""Tools some tests need beyond the virtual environment (headless Chromium, valgrind). Where one
is missing such a test skips, saying why; under ``LADDER_REQUIRE_TOOLS=1``, which .ci/run sets
once it has installed them all, it fails instead, so that a failed install cannot pass as a
skipped test."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRED = os.environ.get("LADDER_REQUIRE_TOOLS") == "1"


def missing(reason: str) -> NoReturn:
    """The test cannot run without a tool: skipped, or failed under ``LADDER_REQUIRE_TOOLS=1``."""
    if REQUIRED:
        pytest.fail(f"{reason}; LADDER_REQUIRE_TOOLS=1 (.ci/run) requires it", pytrace=False)
    pytest.skip(reason)
