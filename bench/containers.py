"""What containers cost at start (issue 45): a job instance's launch and a node's provisioning, on the
local back end, with runtime ``process`` and with runtime ``podman``, side by side.

Measured at the back end, as the services use it, the image already in the store (a pull is the
registry's time, not the runtime's):

- a job instance's launch: from ``run`` of a sandboxed task to its program's first line in the log; with
  podman that takes the instance's disk (30 GB, SageMaker's default VolumeSizeInGB: made and mounted as
  the launch does before its tree is prepared), the pod (loopback only, the user namespace of an id
  block), the container (limits, mounts, catatonit), the endpoint relay into the pod, and the ``podman
  exec`` of the program;
- a node's provisioning: from ``provision`` with an OnCreate script to the node Running; with podman its
  disk too (100 GB, the fleet's default ``node_disk_gb``).

Disks are left out where the host cannot make them (backends/disks.py says why).

Each is timed in rounds that alternate the runtimes, and the medians are compared: the target is that
containers add at most 2 s to either. Needs root (containers' user namespaces, Podman's store); the image
is Debian's python3 built offline with mmdebstrap (cached, as scripts/image-dev does), imported into a
store of the bench's own; the Debian packages are installed when missing.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from bench.report import Figure, Report, at_most, heading, line
from bench.scale import Scale
from hyperplan.backends import LocalBackend, LogStream, NodeRef, NodeSpec, NodeState, TaskRef, TaskSpec, disks
from hyperplan.backends.base import ContainerSpec, IdMap, Limits
from hyperplan.containers import image_build
from hyperplan.containers.podman import PodmanStore
from hyperplan.containers.rootfs import cached_rootfs, package_list

ADDED_TARGET = 2.0  # seconds containers may add to a launch or a provisioning
JOB_DISK = 30 * 2**30  # the SDK's default VolumeSizeInGB
NODE_DISK = 100 * 2**30  # the fleet's default [backend] node_disk_gb
IMAGE = "localhost/hyperplan-bench:python"
BENCH_IDS = IdMap(3_100_000_000)  # a block no account is handed (the fleet's range ends below 2**31)
TIMEOUT = 60.0


def run(report: Report, workdir: Path, *, scale: Scale) -> None:
    heading("containers: a job instance's launch and a node's provisioning, process against podman")
    if os.geteuid() != 0:
        line("skipped: containers need root (user namespaces of an id block, Podman's store)")
        report.add(Figure("containers: skipped", "not root"))
        return
    rounds = scale.pick(7, 3, 1)
    store = _store_with_image(workdir / "podman")
    try:
        with _endpoint() as endpoint:
            container = ContainerSpec(
                IMAGE, BENCH_IDS, Limits(1.0, 512 * 2**20, 1024), hosts=("algo-1",), endpoint=endpoint
            )
            node = dataclasses.replace(container, disk_bytes=NODE_DISK if disks.unusable() is None else None)
            backends = {
                "process": LocalBackend(workdir / "backend-process"),
                "podman": LocalBackend(workdir / "backend-podman", podman_store=store.root),
            }
            launches: dict[str, list[float]] = {name: [] for name in backends}
            provisions: dict[str, list[float]] = {name: [] for name in backends}
            source = workdir / "lifecycle"
            source.mkdir()
            (source / "on_create.sh").write_text("#!/bin/sh\necho provisioned\n")
            for round_ in range(rounds):
                for name, backend in backends.items():
                    contained = name == "podman"
                    disk = (
                        workdir / "disks" / f"job-{round_}"
                        if contained and disks.unusable() is None
                        else None
                    )
                    launches[name].append(
                        _launch(backend, f"job-{round_}", container if contained else None, disk)
                    )
                    provisions[name].append(
                        _provision(backend, f"node-{round_}", source, node if contained else None)
                    )
            for backend in backends.values():
                backend.close()
                LocalBackend(backend.layout.root, podman_store=backend.podman_store).adopt([])
    finally:
        disks.release_under(workdir)  # a disk a round left mounted, if it failed midway
        _remove_store(store)
    for what, measured in (("job launch", launches), ("node provisioning", provisions)):
        process, podman = (statistics.median(measured[name]) for name in ("process", "podman"))
        line(f"{what}: process {process:.2f} s, podman {podman:.2f} s (medians of {rounds})")
        report.add(Figure(f"containers: {what}, process", f"{process:.2f} s"))
        report.add(Figure(f"containers: {what}, podman", f"{podman:.2f} s"))
        report.add(at_most(podman - process, ADDED_TARGET, " s", f"containers: {what}, added by podman"))


def _launch(backend: LocalBackend, task_id: str, container: ContainerSpec | None, disk: Path | None) -> float:
    """Seconds from the instance's disk (if any) and run() to the program's first line."""
    started = time.monotonic()
    if disk is not None:
        disks.attach(disks.Disk(disk, JOB_DISK))
    backend.run(TaskSpec(task_id, ("/bin/sh", "-c", "echo started; exec sleep 600"), container=container))
    _wait(lambda: b"started" in backend.read_log(TaskRef(task_id), LogStream.STDOUT).data, task_id)
    seconds = time.monotonic() - started
    backend.terminate(TaskRef(task_id), timedelta(0))
    _wait(lambda: backend.task_status(task_id).state.is_final(), task_id)
    backend.forget(TaskRef(task_id))
    if disk is not None:
        disks.detach(disk)
    return seconds


def _provision(backend: LocalBackend, node_id: str, source: Path, container: ContainerSpec | None) -> float:
    """Seconds from provision() to the node Running (its OnCreate done)."""
    started = time.monotonic()
    backend.provision(
        NodeSpec(
            node_id,
            node_id,
            "ml.m5.large",
            lifecycle_source=source,
            on_create="on_create.sh",
            container=container,
        )
    )
    _wait(lambda: backend.node_status(node_id).state is NodeState.RUNNING, node_id)
    seconds = time.monotonic() - started
    backend.terminate(NodeRef(node_id), timedelta(0))
    _wait(lambda: backend.node_status(node_id).state.is_final(), node_id)
    backend.forget(NodeRef(node_id))
    return seconds


def _wait(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not get there within {TIMEOUT:.0f} s")
        time.sleep(0.005)


def _store_with_image(root: Path) -> PodmanStore:
    image_build.install()
    rootfs = cached_rootfs(image_build.DEFAULT_CACHE, package_list([]))
    store = PodmanStore(root)
    store.prepare()
    changes = [argument for change in image_build.IMAGE_CHANGES for argument in ("--change", change)]
    store.run("import", "--quiet", *changes, str(rootfs.tarball), IMAGE)
    return store


def _remove_store(store: PodmanStore) -> None:
    for command in (("rm", "--all", "--force", "--time", "0"), ("pod", "rm", "--all", "--force")):
        try:
            store.run(*command)
        except Exception as error:  # the bench goes on to report what it measured
            line(f"cleaning the bench's store: {error}")
    store.remove()
    shutil.rmtree(store.root, ignore_errors=True)


class _endpoint:
    """A listening socket on loopback for the relay to lead to (nothing connects: its start is timed)."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *_: object) -> None:
        self.sock.close()
