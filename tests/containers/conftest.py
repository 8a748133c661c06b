"""One registry, one build of each image and one clean Podman store per test session (per xdist worker),
shared by the containers tests, all ended and removed at the end.

They need root (apt-get installs podman, runc, mmdebstrap and docker-registry; mmdebstrap and Podman run
as root): elsewhere, or where apt-get cannot install them, the tests skip, saying why. The root file
system tarball is cached in a directory every worker of one run shares (the parent of the workers' own
temporary directories), so a run builds it once, whichever worker comes first, and the next waits on
image-dev's lock. Each worker's registry listens on a free port, and each Podman store is a directory of
its own with its own locks: workers do not meet, nor touch root's default store.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperplan.backends import disks
from hyperplan.containers import image_build, registry_dev
from hyperplan.containers.host_tools import Refused
from hyperplan.containers.podman import PodmanStore
from hyperplan.services.accounts.os_users import exists
from tests.harness import Server, made_os_users

SCRIPTS = Path(__file__).parents[2] / "scripts"
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
        yield Built(registry, python, python_digest, trained, trained_digest)
    finally:
        PodmanStore(store).remove()


@pytest.fixture(scope="session")
def pulled(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanStore]:
    """A new store that has nothing but the two images, pulled from the registry by reference."""
    store = PodmanStore(tmp_path_factory.mktemp("pull-store"))
    store.prepare()
    try:
        assert podman(store, "images", "--quiet").stdout == ""  # so each image below comes from the registry
        for reference in (built.python, built.sagemaker):
            pull = podman(store, "pull", "--quiet", "--tls-verify=false", reference)
            assert pull.returncode == 0, pull.stderr
        yield store
    finally:
        store.remove()


CONTAINED_FLEET = """
region = "us-west-2"
currency = "USD"

[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = ["subnet-00000000000000a01"]

[[pools]]
instance_type = "ml.m5.12xlarge"
zone = "us-west-2a"
count = 6
reservable = 0
price_per_instance_hour = "2.50"
limits_scale = 0.5

[instance_types."ml.m5.12xlarge"]
vcpus = 2
memory_gib = 1

[backend]
runtime = "podman"
podman_store = "{store}"
podman_store_gb = {store_gb}
node_image = "{node_image}"

[registries."{registry}"]
insecure = true
"""
"""A fleet of on-demand m5s small enough for this host (a container of 1 CPU and 512 MiB), its work in
containers of a store of the test's (``store_gb`` its own file system; 0: none), its nodes of
``node_image``, pulling over plain HTTP from ``registry``."""


def push_image(built: Built, context: Path, name: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``context`` (a Containerfile ``FROM`` the session's Python image, and its files) built offline and
    pushed to the session's registry as ``hyperplan/NAME``; its reference. The store it was built in goes."""
    store = PodmanStore(tmp_path_factory.mktemp(f"{name.split(':')[0]}-store"))
    store.prepare()
    reference = f"{built.registry}/hyperplan/{name}"
    try:
        for command in (
            ("pull", "--quiet", "--tls-verify=false", built.python),
            ("build", "--quiet", "--network=none", "--pull=never", "--tag", reference, str(context)),
            ("push", "--quiet", "--tls-verify=false", reference),
        ):
            done = podman(store, *command)
            assert done.returncode == 0, done.stderr
    finally:
        store.remove()
    return reference


def run_wide_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this run that its xdist workers share (each worker's base is below the run's)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def contained_server(store: PodmanStore, fleet: str, *extra_args: str) -> Iterator[Server]:
    """A server as root in isolation mode users, its tenant work in containers of ``store`` (``fleet``
    names it, with runtime podman), its data and work directories where the accounts' users may pass.
    On the way out: the server and whatever it started, every container and pod of the store, the store,
    the disks of its jobs, and the OS users the server made."""
    store.prepare()
    base = Path(tempfile.mkdtemp(prefix="hp-containers-"))  # pytest's own directories are 0700
    base.chmod(0o711)
    (base / "fleet.toml").write_text(fleet)
    (base / "work").mkdir()
    data_dir = base / "data"
    server = Server(
        data_dir,
        fleet=base / "fleet.toml",
        extra_args=("--isolation", "users", "--work-dir", str(base / "work"), *extra_args),
    )
    try:
        server.start(timeout=120)
        yield server
    finally:
        users = made_os_users(data_dir)
        server.close()
        podman(store, "rm", "--all", "--force", "--time", "0")
        podman(store, "pod", "rm", "--all", "--force")
        disks.release_under(store.root)  # its own file system, where the fleet gave it one
        store.remove()
        disks.release_under(base)  # jobs' disks the server left mounted (one that ended early)
        for user in users:
            subprocess.run(["userdel", user], capture_output=True, check=False, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
        assert not [user for user in users if exists(user)], users
