"""`make run`'s setup of runtime podman (hyperplan/containers/demo_runtime.py), for a data directory of its
own on a free port (never 5000, a developer's): the registry comes up in the data directory, the demo's
images are built into it once and pulled from it; the next setup reuses both; a registry of someone else
that holds the images is used as it is; a port held by anything else fails the registry's step.

Cheap, as the containers part's budget wants: the build reuses the session's root file system (the `built`
fixture made it), so it is an import and two pushes, not mmdebstrap; the images are pulled into the
session's `pulled` store, which holds their layers already (the manifests and configurations come from
the new registry), and untagged after. The decision itself is tests/core/test_demo_runtime_choice.py's.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hyperplan.containers import registry_dev
from hyperplan.containers.demo_runtime import DEMO_IMAGES, StepFailed, set_up
from hyperplan.containers.host_tools import free_port, marked_processes
from hyperplan.containers.podman import PodmanStore
from tests.containers.conftest import Built, podman, run_wide_directory

pytestmark = pytest.mark.containers


def test_the_setup_fills_a_registry_in_the_data_directory_once_and_its_images_pull(
    built: Built, pulled: PodmanStore, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    cache = run_wide_directory(tmp_path_factory) / "image-dev-cache"  # the session's: no mmdebstrap here
    build_store = PodmanStore(tmp_path / "build-store")
    data_dir = tmp_path / "data"
    directory = data_dir / "registry"
    port = free_port()
    address = f"127.0.0.1:{port}"
    try:
        first = set_up(data_dir, port=port, cache=cache, store=build_store.root)
        assert (first.address, first.directory, first.started) == (address, directory, True)
        assert first.built == tuple(f"{address}/{name}" for name, _ in DEMO_IMAGES)
        assert (directory / "address").read_text() == f"{address}\n"

        again = set_up(data_dir, port=port, cache=cache, store=build_store.root)
        assert (again.directory, again.started, again.built) == (directory, False, ())  # nothing rebuilt

        # Another data directory on the same port: the registry there is not its own, but has the images.
        theirs = set_up(tmp_path / "other-data", port=port, cache=cache, store=build_store.root)
        assert (theirs.directory, theirs.built) == (None, ())
        assert not (tmp_path / "other-data" / "registry").exists()

        for reference in first.built:
            pull = podman(pulled, "pull", "--quiet", "--tls-verify=false", reference)
            assert pull.returncode == 0, pull.stderr
    finally:
        podman(pulled, "rmi", "--ignore", *(f"{address}/{name}" for name, _ in DEMO_IMAGES))  # tags only
        registry_dev.down(directory)
        build_store.remove()
    assert not marked_processes(registry_dev.MARK_VARIABLE, str(directory))


def test_a_port_held_by_something_else_fails_the_registrys_step(
    container_tools: None, tmp_path: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # bound, not listening: the port is taken, and nothing answers
        port = int(holder.getsockname()[1])
        with pytest.raises(StepFailed) as failed:
            set_up(tmp_path / "data", port=port, cache=tmp_path / "cache", store=tmp_path / "store")
    assert failed.value.failure.step == f"the registry on 127.0.0.1:{port}"
    assert failed.value.failure.why.startswith(f"port {port} is taken by another program")
    assert not (tmp_path / "store").exists()  # nothing was built
