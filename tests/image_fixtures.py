"""A pytest plugin (tests/conftest.py loads it): one dev registry and one build of the project's two Python
images per test session (per xdist worker), shared by every test directory that needs them (the
containers tests, the Slurm tests in containers), all ended and removed at the end. Defined once here, so
a worker that runs both kinds of test starts one registry and builds once.

They need root (apt-get installs podman, runc, mmdebstrap and docker-registry; mmdebstrap and Podman run
as root): elsewhere, or where apt-get cannot install them, the tests that ask for them skip, saying why.
The root file system tarball is cached in a directory every worker of one run shares (the parent of the
workers' own temporary directories), so a run builds it once, whichever worker comes first, and the next
waits on image-dev's lock. Each worker's registry listens on a free port, and each Podman store is a
directory of its own with its own locks: workers do not meet, nor touch root's default store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperplan.containers import image_build, registry_dev
from hyperplan.containers.host_tools import Refused
from hyperplan.containers.podman import PodmanStore

SCRIPTS = Path(__file__).parents[1] / "scripts"
SCRIPT_TIMEOUT = 900  # a first build on a fresh machine installs packages and runs mmdebstrap


def script(name: str, *arguments: str | Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``scripts/NAME ARGUMENTS``, reading ``stdin`` (a password) and nothing else."""
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *map(str, arguments)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
    )


def podman(store: PodmanStore, *arguments: str | Path) -> subprocess.CompletedProcess[str]:
    """``podman ARGUMENTS`` on the store, reading nothing (a worker's standard input is its command pipe)."""
    return subprocess.run(
        ["podman", *map(str, arguments)],
        env=store.environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


@dataclass(frozen=True)
class Built:
    registry: str  # 127.0.0.1:PORT
    python: str  # the references image-dev printed, and the digests
    python_digest: str
    sagemaker: str
    sagemaker_digest: str
    store: Path  # where image-dev built them: the session's other images are built there too


@pytest.fixture(scope="session")
def container_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip(
            "needs root: installs podman, runc, mmdebstrap and docker-registry, and runs them as root"
        )
    try:
        registry_dev.install()
        image_build.install()
    except Refused as refusal:
        pytest.skip(f"the container tools cannot be installed: {refusal}")


@pytest.fixture(scope="session")
def registry(container_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("registry")
    try:
        up = script("registry-dev", "up", directory, "--port", "0")
        assert up.returncode == 0, up.stderr
        yield up.stdout.strip()
    finally:
        script("registry-dev", "down", directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def built(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    cache = run_wide_directory(tmp_path_factory) / "image-dev-cache"
    store = tmp_path_factory.mktemp("build-store")
    try:
        plain = script("image-dev", "build", registry, "--cache", cache, "--store", store)
        assert plain.returncode == 0, plain.stderr
        sagemaker = script("image-dev", "build", registry, "--sagemaker", "--cache", cache, "--store", store)
        assert sagemaker.returncode == 0, sagemaker.stderr
        (python, python_digest), (trained, trained_digest) = plain.stdout.split(), sagemaker.stdout.split()
        yield Built(registry, python, python_digest, trained, trained_digest, store)
    finally:
        PodmanStore(store).remove()


def push_image(built: Built, context: Path, name: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``context`` (a Containerfile ``FROM`` the session's Python image, and its files) built offline and
    pushed to the session's registry as ``hyperplan/NAME``; its reference. Built in the store the session's
    images were built in, which has the Python image already (no pull, no store of its own to make and
    remove: a few seconds less per image and worker)."""
    del tmp_path_factory  # (kept for the callers: a store of its own is no longer made)
    store = PodmanStore(built.store)
    reference = f"{built.registry}/hyperplan/{name}"
    commands = [
        ("build", "--quiet", "--network=none", "--pull=never", "--tag", reference, str(context)),
        ("push", "--quiet", "--tls-verify=false", reference),
    ]
    if podman(store, "image", "exists", built.python).returncode != 0:
        commands.insert(0, ("pull", "--quiet", "--tls-verify=false", built.python))
    for command in commands:
        done = podman(store, *command)
        assert done.returncode == 0, done.stderr
    return reference


def run_wide_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this run that its xdist workers share (each worker's base is below the run's)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
