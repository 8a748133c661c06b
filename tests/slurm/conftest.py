"""One dev cluster per test session (per xdist worker), shared by the Slurm tests, torn down at the end;
and one marked image for the Slurm tests in containers (tests/slurm/contained.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.image_fixtures import Built
from tests.slurm.cluster import Cluster, running_cluster
from tests.slurm.contained import MarkedImage, build_marked_image


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    yield from running_cluster()


@pytest.fixture(scope="session")
def slurm_marked_image(built: Built, tmp_path_factory: pytest.TempPathFactory) -> MarkedImage:
    """One marked image per session for the Slurm tests in containers (tests/slurm/contained.py): the
    nodes' image and the jobs' training image, built once from the session's Python image."""
    return build_marked_image(built, tmp_path_factory)
