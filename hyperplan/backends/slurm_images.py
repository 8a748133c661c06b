"""Images unpacked once for the Slurm back end's nodes: the root file systems its containers run on.

On Slurm the step runner starts each node and job instance in a rootless runc container whose root file
system is an image unpacked by the server on the work root every node mounts (``ROOT/images``). This
module makes those: the image pulled into the server's Podman store when the store lacks it (with the
registry's login, through a 0600 auth file that goes: ``images.pull``), its merged layers copied out as
root, then made safe to share and ready to be a container's root.

Layout, under ``IMAGES`` (each reference has a KEY, a digest of the reference string)::

    IMAGES/KEY/rootfs/       the file system (root's, read-only to every user, readable by all)
    IMAGES/KEY/image.json    {"reference", "id", "digest"}: written last, so that its presence says ready
    IMAGES/KEY.failed.json   {"reference", "message"}: why it could not be made
    IMAGES/KEY.lock          what two servers on one work root (PostgreSQL fleets) take in turn
    IMAGES/.KEY.*            a rootfs being made; renamed to IMAGES/KEY once complete

Only the holder of ``KEY.lock`` (``fcntl.flock``) makes KEY, in a temporary directory renamed into place
at once, so a reader sees a complete image or none; a temporary directory found by the next holder (its
maker died) is removed.

Failures: a reference that failed in this process is not tried again by it (``problem`` says why); one
that failed in an earlier process (a ``KEY.failed.json`` on the work root) is tried again once, by the
first ``prepare`` of this process, which removes the old record first. So a server that restarts tries
each failed image once more, never in a loop.

Unpacked images are never removed (an image no node or job uses any more stays on the work root).

Why the copy is made safe, beyond what ``cp`` preserves: every user on every Slurm node can reach
``IMAGES`` outside any container, and the image is the tenant's own choice (a job's training image), so
nothing in it may give anyone more than read access to its files:

- no setuid or setgid bit, no file capability (``security.capability``) and no other extended attribute
  (ACLs among them): any of these on a root-owned file of the work root would give whoever runs it
  root's powers on the node;
- no device node (a world-writable node of the host's disk would be the disk);
- no write bit for group or others, and no owner but root: a file the image gives to uid 104 would be
  the file of whichever host user has uid 104 (accounts' users are system users, ids in that range),
  who could then change the image under every other tenant. Root's files stay root's; the groups stay.

Inside a container none of this is lost: its user namespace maps the tenant's uid alone (to 0), so every
file of the image is already someone else's there and its root file system is read-only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hyperplan.backends import images
from hyperplan.backends.base import BackendError, Login
from hyperplan.backends.containers import Podman
from hyperplan.backends.slurm_records import read_json, write_json
from hyperplan.containers.host_tools import locked

log = logging.getLogger(__name__)

MOUNT_DIRS: tuple[str, ...] = (
    "/opt/ml", "/opt/sagemaker", "/run/hyperplan/env", "/tmp", "/var/tmp", "/root", "/proc", "/dev", "/sys",
)  # fmt: skip
MOUNT_FILES: tuple[str, ...] = ("/run/hyperplan/init", "/etc/hosts", "/etc/resolv.conf")
"""Mount points the containers' configurations use: made in every unpacked rootfs (empty; a file only where
the image has none; never replacing what the image has, but a symlink in the image at one of these paths
is replaced by a real directory/file so a bind can never be redirected)."""
KEEP_IMAGE_MODE = frozenset({"/tmp", "/var/tmp"})
"""Mount directories left with the image's own mode (sticky, and no longer writable once made safe)."""

KEY_LENGTH = 32
UNPACK_TIMEOUT = 3600.0
"""``cp`` of one image's file system: a GPU training image is tens of GB."""
POLL_SECONDS = 0.5
"""How often ``wait`` looks at the work root for an image another server is making."""
DROPPED_MODE_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH
DIRECTORY_MODE = 0o755
FILE_MODE = 0o644


class ImageNotReady(BackendError):
    """``wait`` gave up: the image could not be made (the message says why), or it is not made yet."""


def image_key(reference: str) -> str:
    """The name of ``reference``'s directory under IMAGES: a digest of the string, so any reference is a
    safe file name."""
    return hashlib.sha256(reference.encode()).hexdigest()[:KEY_LENGTH]


class SlurmImages:
    """The images unpacked under ``directory`` (IMAGES), from the Podman store of ``podman``."""

    def __init__(self, directory: Path, podman: Podman) -> None:
        self.directory = directory
        self.podman = podman
        self._guard = threading.Lock()
        self._making: dict[str, threading.Event] = {}  # reference -> set once it is ready or failed
        self._ready: dict[str, Path] = {}
        self._failed: dict[str, str] = {}  # failed in this process: not tried again

    def rootfs(self, reference: str) -> Path | None:
        """The unpacked root of ``reference`` if it is ready, else None. Never blocks."""
        with self._guard:
            if reference in self._ready:
                return self._ready[reference]
        found = self._ready_on_disk(reference)
        if found is not None:
            with self._guard:
                self._ready[reference] = found
        return found

    def problem(self, reference: str) -> str | None:
        """Why the image cannot be unpacked (pull or unpack failed), as a sentence that names the image
        ("the image REF could not be pulled: ..."); None while it is being made or when ready."""
        with self._guard:
            if reference in self._ready or reference in self._making:
                return None
        if self.rootfs(reference) is not None:  # made by another server, even after it failed here
            return None
        with self._guard:
            if reference in self._failed:
                return self._failed[reference]
        record = read_json(self._failed_path(reference))  # by an earlier process, or another server
        if record is None or record.get("reference") != reference:
            return None
        return str(record.get("message") or f"the image {reference} could not be unpacked")

    def prepare(self, reference: str, login: Login | None = None, insecure: bool = False) -> None:
        """Start making it in a background thread unless it is ready, being made, or has failed in this
        process. Returns at once. A failure recorded by an earlier process is removed and tried again."""
        with self._guard:
            if reference in self._making or reference in self._failed or reference in self._ready:
                return
            ready = self._ready_on_disk(reference)
            if ready is not None:
                self._ready[reference] = ready
                return
            self._failed_path(reference).unlink(missing_ok=True)
            done = self._making[reference] = threading.Event()
        worker = threading.Thread(
            target=self._make,
            args=(reference, login, insecure, done),
            name=f"slurm-image-{image_key(reference)[:8]}",
            daemon=True,  # a server that stops does not wait for a pull; the next maker clears its leftovers
        )
        worker.start()

    def wait(self, reference: str, timeout: float) -> Path:
        """The unpacked root once it is ready. Raises ImageNotReady with the problem if it could not be
        made, or if it is not ready within ``timeout`` seconds (``prepare`` starts it)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.rootfs(reference)
            if found is not None:
                return found
            problem = self.problem(reference)
            if problem is not None:
                raise ImageNotReady(problem)
            left = deadline - time.monotonic()
            if left <= 0:
                raise ImageNotReady(f"the image {reference} was not unpacked within {timeout:.0f} s")
            with self._guard:
                done = self._making.get(reference)
            if done is not None:
                done.wait(min(left, POLL_SECONDS))
            else:
                time.sleep(min(left, POLL_SECONDS))  # made by another server, if by anyone

    # --- making (on the worker thread) ------------------------------------------------------------

    def _make(self, reference: str, login: Login | None, insecure: bool, done: threading.Event) -> None:
        try:
            made = self._make_under_lock(reference, login, insecure)
        except Exception as error:
            message = _sentence(reference, error)
            with self._guard:
                self._failed[reference] = message
        else:
            with self._guard:
                self._ready[reference] = made
        finally:
            with self._guard:
                self._making.pop(reference, None)
            done.set()

    def _make_under_lock(self, reference: str, login: Login | None, insecure: bool) -> Path:
        """The image made by this process, or found made by another one that held KEY's lock first; a
        failure is recorded before the lock goes, so the next holder sees it or a complete image."""
        _shared_directory(self.directory)
        key = image_key(reference)
        with locked(self.directory / f"{key}.lock"):
            ready = self._ready_on_disk(reference)
            if ready is not None:
                return ready
            self._failed_path(reference).unlink(missing_ok=True)
            _remove_leftovers(self.directory, key)
            try:
                digest = self._pull_and_unpack(reference, login, insecure, key)
            except Exception as error:
                message = _sentence(reference, error)
                if isinstance(error, BackendError):
                    log.warning("%s", message)
                else:  # a bug or the host's fault: its trace, never a thread dying silently
                    log.exception("unpacking the image %s", reference)
                with contextlib.suppress(OSError):  # (said above; the work root may be full)
                    write_json(
                        self._failed_path(reference), {"reference": reference, "message": message}, FILE_MODE
                    )
                raise
        log.info("unpacked the image %s (%s) into %s", reference, digest, self.directory / key)
        return self.directory / key / "rootfs"

    def _pull_and_unpack(self, reference: str, login: Login | None, insecure: bool, key: str) -> str:
        """IMAGES/KEY made complete (a temporary directory renamed into place); the image's digest."""
        record = _pulled(self.podman, reference, login, insecure)
        temporary = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.directory))
        try:
            _unpack(self.podman, reference, temporary / "rootfs")
            write_json(temporary / "image.json", record, FILE_MODE)
            temporary.chmod(DIRECTORY_MODE)
            os.rename(temporary, self.directory / key)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        return record["digest"]

    # --- what the work root holds -----------------------------------------------------------------

    def _ready_on_disk(self, reference: str) -> Path | None:
        made = self.directory / image_key(reference)
        record = read_json(made / "image.json")
        if record is None or record.get("reference") != reference:
            return None
        return made / "rootfs"

    def _failed_path(self, reference: str) -> Path:
        return self.directory / f"{image_key(reference)}.failed.json"


def _sentence(reference: str, error: Exception) -> str:
    """What went wrong, naming the image: ``images.pull`` says "it could not be pulled: ..."."""
    said = str(error)
    if isinstance(error, images.ImageUnavailable) and said.startswith("it "):
        return f"the image {reference} {said.removeprefix('it ')}"
    return f"the image {reference} could not be unpacked: {said}"


# --- pulling --------------------------------------------------------------------------------------


def _pulled(podman: Podman, reference: str, login: Login | None, insecure: bool) -> dict[str, str]:
    """Pull ``reference`` unless the store has it; what ``image.json`` says of it."""
    if podman.run("image", "exists", reference, check=False).returncode != 0:
        images.pull(podman, reference, login, insecure)
    found = podman.run("image", "inspect", reference, check=False)
    if found.returncode != 0:
        raise BackendError(f"podman image inspect failed: {found.stderr.strip()}")
    image = json.loads(found.stdout)[0]
    return {"reference": reference, "id": image.get("Id") or "", "digest": image.get("Digest") or ""}


# --- unpacking ------------------------------------------------------------------------------------


def _unpack(podman: Podman, reference: str, rootfs: Path) -> None:
    """The image's merged layers copied to ``rootfs`` (a new path) as root, made safe to share
    (:func:`make_safe`) and given the containers' mount points (:func:`make_mount_points`).

    ``podman image mount`` and ``cp``, not ``podman create`` + ``podman export | tar -x``: on the dev
    registry's Python image (177 MB, 7,768 entries), on a quiet host of 2 cores, the copy took 0.42 to
    1.30 s and the export 0.74 to 1.50 s; on the host busy with other work both took 1 to 10 s, the copy
    using less CPU time in every round (1.7 to 3.8 s against 3.4 to 5.7 s)."""
    source = podman.run("image", "mount", reference).stdout.strip()
    try:
        copied = subprocess.run(
            # Owners, modes, times and hard links; not extended attributes (make_safe drops any).
            ["cp", "--recursive", "--no-dereference", "--preserve=mode,ownership,timestamps,links",
             "--reflink=auto", f"{source}/.", str(rootfs)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=UNPACK_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise BackendError(f"copying its file system took more than {UNPACK_TIMEOUT:.0f} s") from None
    finally:
        podman.run("image", "unmount", reference, check=False)
    if copied.returncode != 0:
        said = copied.stderr.strip().splitlines()
        raise BackendError(f"copying its file system failed: {said[-1] if said else copied.returncode}")
    make_safe(rootfs)
    make_mount_points(rootfs)
    os.chown(rootfs, 0, 0)
    rootfs.chmod(DIRECTORY_MODE)


def make_safe(rootfs: Path) -> None:
    """Every entry of ``rootfs`` (a copy no one else can reach yet) made safe to leave where every user
    of the host can reach it: see the module's docstring."""
    for directory, subdirectories, files in os.walk(rootfs):
        for name in (*subdirectories, *files):
            _make_entry_safe(os.path.join(directory, name))


def _make_entry_safe(path: str) -> None:
    info = os.lstat(path)
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        os.unlink(path)
        return
    for attribute in os.listxattr(path, follow_symlinks=False):
        os.removexattr(path, attribute, follow_symlinks=False)
    if info.st_uid != 0:
        os.chown(path, 0, -1, follow_symlinks=False)
    if not stat.S_ISLNK(info.st_mode) and info.st_mode & DROPPED_MODE_BITS:
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~DROPPED_MODE_BITS)


def make_mount_points(rootfs: Path) -> None:
    """MOUNT_DIRS and MOUNT_FILES made in ``rootfs``, each path walked one directory at a time without
    following a link: a link in the image (``/opt -> /etc``) must never lead a root process outside it."""
    top = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for path in MOUNT_DIRS:
            *parents, last = Path(path).relative_to("/").parts
            with _opened_parents(top, parents) as parent:
                _real_directory(parent, last, keep_mode=path in KEEP_IMAGE_MODE)
        for path in MOUNT_FILES:
            *parents, last = Path(path).relative_to("/").parts
            with _opened_parents(top, parents) as parent:
                _real_file(parent, last)
    finally:
        os.close(top)


@contextlib.contextmanager
def _opened_parents(top: int, names: list[str]) -> Iterator[int]:
    """The directory ``top/NAMES...``, each a real directory (made where missing) every user may pass."""
    opened: list[int] = []
    try:
        current = top
        for name in names:
            current = _open_real_directory(current, name)
            opened.append(current)
            info = os.fstat(current)
            if info.st_mode & 0o555 != 0o555:
                os.fchmod(current, stat.S_IMODE(info.st_mode) | 0o555)  # runc passes it as the tenant
        yield current
    finally:
        for fd in reversed(opened):
            os.close(fd)


def _real_directory(parent: int, name: str, keep_mode: bool) -> None:
    """``name`` in ``parent``: a directory (made 0755 root's where missing, or where the image has
    something else there), 0755 root's unless ``keep_mode``."""
    fd = _open_real_directory(parent, name)
    try:
        if not keep_mode:
            os.fchown(fd, 0, 0)
            os.fchmod(fd, DIRECTORY_MODE)
    finally:
        os.close(fd)


def _open_real_directory(parent: int, name: str) -> int:
    info = _lstat_at(parent, name)
    if info is not None and not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent)  # a link or file where a directory must be
        info = None
    if info is None:
        os.mkdir(name, DIRECTORY_MODE, dir_fd=parent)
        os.chmod(name, DIRECTORY_MODE, dir_fd=parent, follow_symlinks=False)  # whatever the umask
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)


def _real_file(parent: int, name: str) -> None:
    """``name`` in ``parent``: the image's regular file if it has one, else an empty 0644 one of root's."""
    info = _lstat_at(parent, name)
    if info is not None and stat.S_ISREG(info.st_mode):
        return
    if info is not None and stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=parent)  # a directory where a file must be
    elif info is not None:
        os.unlink(name, dir_fd=parent)  # a link (or fifo, socket) where a file must be
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE, dir_fd=parent)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def _lstat_at(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


# --- the work root --------------------------------------------------------------------------------


def _shared_directory(directory: Path) -> None:
    """IMAGES made where missing, root's and 0755: every user passes it to reach an image."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, 0, 0)
    directory.chmod(DIRECTORY_MODE)


def _remove_leftovers(directory: Path, key: str) -> None:
    """What a maker of KEY that died left (called under KEY's lock): its temporary directory, and a KEY
    directory without ``image.json`` (renamed complete, so only if someone broke it)."""
    for leftover in directory.glob(f".{key}.*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    made = directory / key
    if made.is_dir() and not (made / "image.json").exists():
        shutil.rmtree(made, ignore_errors=True)
