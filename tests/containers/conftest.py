"""What only the containers tests share: a clean Podman store holding the session's two images, pulled
from the registry (``pulled``), and a contained server (``contained_server``, ``CONTAINED_FLEET``).

The registry, the builds and the helpers around them (``built``, ``podman``, ``push_image``, ...) are
tests/image_fixtures.py's, a plugin of tests/conftest.py that every test directory shares (one registry
and one build per worker); the names this directory's tests import from here are imported below.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.backends import disks
from hyperplan.containers.podman import PodmanStore
from hyperplan.services.accounts.os_users import exists
from tests.harness import Server, made_os_users
from tests.image_fixtures import Built, podman, push_image, run_wide_directory, script

# Imported from here by this directory's tests (the fixtures themselves are the plugin's: never imported
# into this module, which would make a second registry and build for this directory).
__all__ = ["Built", "podman", "push_image", "run_wide_directory", "script"]


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
