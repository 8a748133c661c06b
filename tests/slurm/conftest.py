"""One dev cluster per test session (per xdist worker), shared by the Slurm tests, torn down at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import Cluster, running_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    yield from running_cluster()
