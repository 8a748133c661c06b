"""Each job instance's disk in containers (``backends/disks.py``): ``VolumeSizeInGB`` of ext4, mounted at
``attempt-N/HOST`` before its tree is prepared, and detached (its contents gone, as an instance's volume
is) once the attempt's last checkpoints and model are stored.

On the disk: ``ml/``, the instance's tree, seen as ``/opt/ml`` inside; ``tmp/`` and ``var-tmp/``, seen as
``/tmp`` and ``/var/tmp`` (so what a program leaves there counts against its disk, not the host's); and the
server's staging directories beside the tree (``training/workspace.py`` hard-links what it stores, so they
must be on the tree's file system). The disk's top directory is the server's, 0711: the container's root
owns what is below it, and only that.

Where disks cannot be made (``Settings.disk_problem``) the same directories are plain ones on the host's
file system, and the server said so at its start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from hyperplan.backends import disks
from hyperplan.backends.base import IdMap, Mount
from hyperplan.services.jobs.job_records import DISK_TREE
from hyperplan.services.runtime import tenancy
from hyperplan.services.runtime.context import ServiceContext

log = logging.getLogger(__name__)

SCRATCH = {"tmp": "/tmp", "var-tmp": "/var/tmp"}
"""The disk's directories that stand for the container's scratch directories (sticky, as /tmp is)."""


def disk_top(root: Path) -> Path | None:
    """The directory an instance's disk is mounted at, for its tree ``root``; None for a tree made
    without one (runtime process, or a tree recorded by an older version)."""
    return root.parent if root.name == DISK_TREE else None


def attach(runtime: ServiceContext, root: Path, size_gb: int, ids: IdMap) -> None:
    """The instance's disk mounted (made on first use) and its scratch directories there, the container's
    root's. DiskError (a BackendError) says why it could not be."""
    top = disk_top(root)
    if top is None:
        return
    tenancy.open_passage(runtime.work_dir, top.parent)
    if runtime.settings.bounded_disks:
        disks.attach(disks.Disk(top, size_gb * disks.GIB))
    tenancy.open_passage(runtime.work_dir, top)  # the mounted file system's top: the server's, 0711
    for name in SCRATCH:
        scratch = top / name
        scratch.mkdir(exist_ok=True)
        os.chown(scratch, ids.host_first, ids.host_first, follow_symlinks=False)
        os.chmod(scratch, 0o1777)


def mounts(root: Path) -> list[Mount]:
    """The container's scratch directories, from its disk."""
    top = disk_top(root)
    if top is None:
        return []
    return [Mount(top / name, target) for name, target in SCRATCH.items()]


def reattach(roots: Iterable[Path]) -> None:
    """Mount again the disks of these trees whose image is there but not mounted (a reboot since the
    attempt ran), so that what the instances wrote is read, never an empty directory in its place."""
    for root in roots:
        top = disk_top(root)
        if top is not None and disks.image_of(top).exists():
            try:
                disks.remount(top)
            except disks.DiskError as error:
                log.warning("the disk of %s cannot be mounted again: %s", root, error)


def release(roots: Iterable[Path]) -> None:
    """Detach these trees' disks and delete their images (nothing for trees without one)."""
    for root in roots:
        top = disk_top(root)
        if top is not None:
            try:
                disks.detach(top)
            except disks.DiskError as error:  # retention's removal of the tree tries again
                log.warning("the disk of %s cannot be detached: %s", root, error)
