"""The tests of Ladder on a Redis Cluster: a private cluster of six nodes for the module (or the
test, where it kills a node), the test's settings pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.settings import LadderSettings
from tests.redis_cluster import PrivateCluster


def _running() -> Iterator[PrivateCluster]:
    cluster = PrivateCluster()
    try:
        yield cluster.start()
    finally:
        cluster.remove()


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[PrivateCluster]:
    yield from _running()


@pytest.fixture
def own_cluster() -> Iterator[PrivateCluster]:
    """A cluster of this test alone (it kills or changes nodes)."""
    yield from _running()


def on(cluster: PrivateCluster, settings: LadderSettings) -> LadderSettings:
    """``settings`` with Redis the cluster."""
    return settings.model_copy(update={"redis_url": cluster.url, "redis_cluster": True})
