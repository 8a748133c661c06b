"""One dev cluster per test session (per xdist worker), shared by the Slurm tests, torn down at the end;
one marked image for the Slurm tests in containers (tests/slurm/contained.py), and their servers' Podman
store (one per session)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.backends import disks
from hyperplan.containers.podman import PodmanStore
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


@pytest.fixture(scope="session")
def podman_store_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The contained servers' Podman store, one per session (per worker): the servers of a worker run one
    after another, each pulling what the store lacks, so the marked image is pulled once, not by every
    test. Removed at the session's end, when every server is closed: its mounts first (the servers'
    unpacking mounts images; the overlay driver then mounts its own directory)."""
    store = tmp_path_factory.mktemp("slurm-podman") / "podman-store"
    yield store
    if store.exists():
        subprocess.run(
            ["podman", "image", "unmount", "--all"],
            env=PodmanStore(store).environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            timeout=120,
        )
        disks.release_under(store)
    PodmanStore(store).remove()
