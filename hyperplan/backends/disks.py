"""Disks of a fixed size for tenant work: an ext4 file system in a sparse image file, mounted through a
loop device, one per job instance (its ``/opt/ml`` and ``/tmp``, sized by ``VolumeSizeInGB``) and one per
HyperPod node (its ``/opt/sagemaker`` and ``/tmp``). A tenant that fills its disk gets ENOSPC there; the
host's file system, the server's database and every other tenant's disk are untouched.

Why loop images: Podman bounds a container's own writable layer only where its store is on XFS mounted
with project quotas, and XFS quotas are not in every kernel (this one was built without them), whereas
loop devices and ext4 are everywhere a server runs as root. Where they are not (no ``/dev/loop-control``,
no ``mkfs.ext4``, not root), :func:`unusable` says why and the server announces at start that tenant
disks are not bounded; work then writes into plain directories on the host's file system.

The image is sparse: it takes host disk only as the tenant writes, so the sizes of all disks together may
exceed the host's free space (as thin-provisioned volumes do). The image sits beside its mount point as
``.NAME.disk`` (a name the tenant never sees: the mount point is its directory, the image is not inside).
Mounted ``nosuid,nodev``: a set-uid file or device node written there means nothing.

A mount outlives the server (it is the kernel's): a job that runs across a restart keeps its disk. After a
reboot :func:`remount` mounts an existing image again, so what a job wrote is read
back, never a fresh empty disk in its place.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hyperplan.backends.base import BackendError

COMMAND_TIMEOUT = 120.0
GIB = 2**30
MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1")
"""No blocks reserved for root (the tenant's root is root in its container), and inode tables and journal
written lazily, so a disk of any size is made in a fraction of a second."""


NOT_BOUNDED = (
    "the disks of job instances and nodes are NOT bounded: they write into directories on the host's file "
    "system, which one tenant can fill"
)


MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
"""``noinit_itable``: the kernel would otherwise zero the inode tables in the background after the mount,
allocating host disk for them (gigabytes for a large disk); in a sparse image they read as zeros already."""


class DiskError(BackendError):
    """A disk could not be made, mounted or removed: the host's command said why."""


@dataclass(frozen=True)
class Disk:
    """A file system of ``size_bytes`` mounted at ``mountpoint``, from the image file beside it."""

    mountpoint: Path
    size_bytes: int

    @property
    def image(self) -> Path:
        return image_of(self.mountpoint)

    def __post_init__(self) -> None:
        if self.size_bytes < 16 * 2**20:
            raise ValueError(f"a disk of {self.size_bytes} bytes: at least 16 MiB")


def image_of(mountpoint: Path) -> Path:
    return mountpoint.with_name(f".{mountpoint.name}.disk")


def unusable() -> str | None:
    """Why disks cannot be made on this host, or None when they can."""
    if os.geteuid() != 0:
        return "the server is not root (mounting a disk needs root)"
    if not Path("/dev/loop-control").exists():
        return "the host has no loop devices (/dev/loop-control)"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install e2fsprogs mount)"
    return None


def attach(disk: Disk) -> None:
    """Mount the disk, made first if its image is not there; nothing when it is mounted. DiskError says
    why it could not be."""
    if is_mounted(disk.mountpoint):
        return
    disk.mountpoint.mkdir(parents=True, exist_ok=True)
    if not disk.image.exists():
        _make_image(disk)
    _run("mount", "-o", MOUNT_OPTIONS, str(disk.image), str(disk.mountpoint))


def remount(mountpoint: Path) -> bool:
    """The disk an earlier :func:`attach` made at ``mountpoint`` mounted again (a reboot unmounted it), at
    the size it was made with; nothing when it is mounted. False: it has none (never made, or detached).
    DiskError says why it could not be."""
    if is_mounted(mountpoint):
        return True
    image = image_of(mountpoint)
    if not image.exists():
        return False
    mountpoint.mkdir(exist_ok=True)
    _run("mount", "-o", MOUNT_OPTIONS, str(image), str(mountpoint))
    return True


def _make_image(disk: Disk) -> None:
    """A sparse image with an empty ext4 on it, written under a temporary name and renamed: a crash
    midway never leaves an image that looks made."""
    partial = disk.image.with_name(disk.image.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, disk.size_bytes)
    finally:
        os.close(fd)
    try:
        _run("mkfs.ext4", *MKFS_OPTIONS, str(partial))
        os.replace(partial, disk.image)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def bind(directory: Path, onto: Path) -> None:
    """``directory`` (of a disk) seen at ``onto`` as well: what is written there is on the disk. Its
    :func:`release_under` undoes it."""
    _run("mount", "--bind", "-o", "nosuid,nodev", str(directory), str(onto))


def detach(mountpoint: Path) -> None:
    """Unmount the disk at ``mountpoint`` (if it is mounted) and delete its image: what was on it is gone,
    as an instance's volume is when the instance ends. A mount still held by a process that has not gone
    yet is detached lazily: the kernel frees it once that process does."""
    if is_mounted(mountpoint):
        said = _run("umount", str(mountpoint), check=False)
        if said.returncode != 0 and is_mounted(mountpoint):
            _run("umount", "--lazy", str(mountpoint))
    image_of(mountpoint).unlink(missing_ok=True)


def release_under(directory: Path) -> int:
    """Detach every disk mounted at or below ``directory`` (deepest first): before a tree is removed, so
    that its removal never reaches into a mounted disk, nor leaves one mounted. Returns how many."""
    found = [point for point in mounts() if point == directory or point.is_relative_to(directory)]
    for point in sorted(found, key=lambda path: len(path.parts), reverse=True):
        detach(point)
    return len(found)


def is_mounted(path: Path) -> bool:
    return path in mounts()


def mounts() -> list[Path]:
    """Every mount point of this mount namespace (``/proc/self/mountinfo``, its octal escapes undone)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    return [Path(_unescape(fields[4])) for fields in map(str.split, lines) if len(fields) > 4]


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, line break or backslash in a path as a backslash and three octal
    digits."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    clean = {key: os.environ[key] for key in ("PATH",) if key in os.environ}
    try:
        result = subprocess.run(
            command,
            env=clean,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DiskError(f"{command[0]}: {error}") from None
    if check and result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise DiskError(f"{command[0]} failed: {said[-1] if said else result.returncode}")
    return result
