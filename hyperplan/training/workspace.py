"""One instance's directory tree: made and filled before the process starts, emptied into storage after.

``prepare`` makes the tree of :mod:`hyperplan.training.contract`, writes the config files, fetches every
channel, restores checkpoints from CheckpointConfig's URI (a restarted job finds its last ones) and, in
script mode, unpacks the code. ``sync_checkpoints`` is called by the runner while the job runs and once
more when it ends; ``pack_model`` stores the model (and non-empty output data) when it has succeeded.

A root may be reused for a restart: files are overwritten, never deleted. Every storage failure is a
:class:`~hyperplan.objects.uris.StorageError` naming the URI; a job that cannot run at all is a
:class:`~hyperplan.training.contract.NoCommand` or ``UnsupportedInput``, raised before any I/O.

**The tree is the tenant's.** ``prepare(..., owner=...)`` fills the tree as the server and then hands it
to the account's OS user (every entry lchown'd, the top 0700), so that the job's process, running as
that user, writes its model, output and checkpoints there. From then on anything in it may be a trap: a
``model/key -> DATA_DIR/master.key`` link, or a file swapped for such a link between a check and an
open. So the server never reads the tree by name: every read-back (``sync_checkpoints``, ``pack_model``,
``read_failure``) opens each component from the root with ``O_NOFOLLOW`` and keeps only what it opened
as a regular file or directory (links, FIFOs and sockets are skipped), and the files it takes are hard
links of the very files it opened (no copy; a copy only where a link cannot be made) in a staging
directory of the server's beside the root, which the storage layer then reads by path. Reading as the
user instead would need a process per read and a way to hand the bytes back, for the same result. The
root's parent must be the server's own (not writable by others); the same rules hold with no owner
(isolation mode ``none``), where they cost nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import StorageError, join_uri
from hyperplan.training.contract import Contract, JobSpec, Layout, ScriptMode, build_contract

MODEL_ARCHIVE = "model.tar.gz"
OUTPUT_ARCHIVE = "output.tar.gz"


class Owner(Protocol):
    """Whom an instance's tree is handed to: an OS user's ids (``hyperplan.backends.RunAs`` is one)."""

    @property
    def uid(self) -> int: ...

    @property
    def gid(self) -> int: ...


@dataclass(frozen=True)
class Prepared:
    """A ready tree: the contract to start the process with, and what was fetched into it."""

    contract: Contract
    channel_files: dict[str, int]
    restored_checkpoints: int
    code_files: int


def prepare(root: Path, spec: JobSpec, storage: Storage, owner: Owner | None = None) -> Prepared:
    """Make and fill the tree; with ``owner``, hand it to that user once it is full (see the module
    docstring). A root that already belongs to another user is refused: the server would write into a
    tree the tenant controls."""
    contract = build_contract(spec, root)
    layout = contract.layout
    if owner is not None:
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(root).st_uid != os.geteuid():
                raise ValueError(f"{root}: the instance tree exists and is not the server's: not reused")
    for directory in layout.directories(spec.channels):
        directory.mkdir(parents=True, exist_ok=True)
    for path, content in contract.config_files().items():
        _write_json_atomically(path, content)
    channel_files = {}
    for channel in spec.channels:
        count = storage.download_prefix(
            channel.uri, layout.channel_dir(channel.name), contract.channel_shards.get(channel.name)
        )
        if count == 0:
            raise StorageError(channel.uri, f"no objects found for channel {channel.name!r}")
        channel_files[channel.name] = count
    restored = restore_checkpoints(root, spec, storage)
    code_files = _fetch_code(contract.script, layout, storage) if contract.script else 0
    if owner is not None:
        hand_over(root, owner)
    return Prepared(contract, channel_files, restored, code_files)


def hand_over(root: Path, owner: Owner) -> None:
    """Give the tree to ``owner``: every entry lchown'd bottom up (a link is changed itself, never what
    it points to), the root last and 0700. Call it before any process of that user runs in the tree."""
    for parent, directories, files in os.walk(root, topdown=False):  # never descends into a link
        for name in (*directories, *files):
            os.chown(os.path.join(parent, name), owner.uid, owner.gid, follow_symlinks=False)
    os.chown(root, owner.uid, owner.gid, follow_symlinks=False)
    os.chmod(root, 0o700)


def restore_checkpoints(root: Path, spec: JobSpec, storage: Storage) -> int:
    """Fetch the checkpoints stored so far (none on a first start); on a reused root, local files newer
    than the stored ones are kept. Returns how many files were fetched."""
    if not spec.checkpoint_uri:
        return 0
    return storage.sync_dir_from(spec.checkpoint_uri, _layout(root, spec).checkpoint_dir)


def sync_checkpoints(root: Path, spec: JobSpec, storage: Storage) -> int:
    """Store the new and changed checkpoint files (regular files only, no link followed). Returns how
    many were uploaded."""
    if not spec.checkpoint_uri:
        return 0
    with _staging(root) as staging:
        taken = staging / "checkpoints"
        if not _take(root, _layout(root, spec).checkpoint_dir, taken):
            return 0
        return storage.sync_dir_to(taken, spec.checkpoint_uri)


def model_uri(spec: JobSpec) -> str:
    return join_uri(spec.output_path, spec.job_name, "output", MODEL_ARCHIVE)


def output_data_uri(spec: JobSpec) -> str:
    return join_uri(spec.output_path, spec.job_name, "output", OUTPUT_ARCHIVE)


def pack_model(root: Path, spec: JobSpec, storage: Storage) -> str:
    """Store the model directory as OUTPUT_PATH/JOB_NAME/output/model.tar.gz (files at the archive's top,
    as SageMaker does) and output/data, if it holds anything, as output.tar.gz. Returns the model's URI.
    With several instances, call it for the first host only."""
    layout = _layout(root, spec)
    uri = model_uri(spec)
    # Taken from the tree without following links, archived in the server's own staging directory (an
    # archive written into the tree would follow a link planted in its place).
    with _staging(root) as staging:
        data = staging / "data"
        if _take(root, layout.output_data_dir, data) and any(data.iterdir()):
            _store_archive(data, staging / OUTPUT_ARCHIVE, output_data_uri(spec), storage)
        model = staging / "model"
        if not _take(root, layout.model_dir, model):
            model.mkdir()
        _store_archive(model, staging / MODEL_ARCHIVE, uri, storage)
    return uri


def read_failure(root: Path, limit: int) -> str:
    """The first ``limit`` characters of what the algorithm wrote to /opt/ml/output/failure; "" when
    there is no such regular file (a link there is not followed)."""
    relative = Layout(root).failure_file.relative_to(root)
    directory = _open_directory(root, relative.parent)
    if directory is None:
        return ""
    try:
        fd = _open_file(directory, relative.name)
    finally:
        os.close(directory)
    if fd is None:
        return ""
    with os.fdopen(fd, "rb") as source:
        return source.read(limit * 4).decode(errors="replace")[:limit].strip()


# -- reading the tenant's tree -----------------------------------------------------------------------

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs us


@contextlib.contextmanager
def _staging(root: Path) -> Iterator[Path]:
    """A fresh directory of the server's beside ``root`` (on the same filesystem, for hard links),
    removed afterwards. Refused when the root's parent is not the server's alone: its owner could move
    the staging directory away and put a link in its place."""
    parent = root.parent
    info = os.lstat(parent)
    others_write = info.st_mode & 0o002 or (info.st_mode & 0o020 and info.st_gid != os.getegid())
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or others_write:
        raise OSError(f"{parent}: an instance tree's parent must be a directory only the server can write")
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.taken-", dir=parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _open_directory(root: Path, relative: Path) -> int | None:
    """A descriptor of ``root/relative``, no link followed from ``root`` on (``root``'s own path is the
    server's); None if that is not a directory."""
    try:
        top = os.open(root, _DIRECTORY_FLAGS)
    except OSError:
        return None
    try:
        return _open_directory_at(top, relative.parts)
    finally:
        os.close(top)


def _open_file(directory: int, name: str) -> int | None:
    """A descriptor of the regular file ``name`` in ``directory``; None for anything else."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=directory)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _take(root: Path, directory: Path, into: Path) -> bool:
    """Mirror the regular files and directories under ``directory`` (inside ``root``) into the new
    directory ``into``: each file a hard link of the file opened (so its size and mtime are the
    original's), or a copy where no link can be made. False when ``directory`` is not a directory."""
    top = _open_directory(root, directory.relative_to(root))
    if top is None:
        return False
    try:
        into.mkdir()
        pending: list[tuple[tuple[str, ...], Path]] = [((), into)]
        while pending:  # a loop, not recursion: the tenant chooses the depth
            parts, target = pending.pop()
            here = _open_directory_at(top, parts)
            if here is None:
                continue  # replaced since it was listed
            try:
                for name in sorted(os.listdir(here)):
                    try:
                        mode = os.stat(name, dir_fd=here, follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if stat.S_ISDIR(mode):
                        (target / name).mkdir()
                        pending.append(((*parts, name), target / name))
                    elif stat.S_ISREG(mode):
                        _take_file(here, name, target / name)
            finally:
                os.close(here)
    finally:
        os.close(top)
    return True


def _open_directory_at(top: int, parts: tuple[str, ...]) -> int | None:
    fd = os.dup(top)
    for name in parts:
        try:
            inner = os.open(name, _DIRECTORY_FLAGS, dir_fd=fd)
        except OSError:
            inner = None
        os.close(fd)
        if inner is None:
            return None
        fd = inner
    return fd


def _take_file(directory: int, name: str, dest: Path) -> None:
    fd = _open_file(directory, name)
    if fd is None:
        return  # gone, or not a regular file (a link is not followed)
    try:
        try:
            # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N links the open file itself, whatever its
            # name now points to. (A tenant can hard-link only files it may read anyway.)
            os.link(f"/proc/self/fd/{fd}", dest)
        except OSError:
            info = os.fstat(fd)
            with open(dest, "xb") as out, os.fdopen(os.dup(fd), "rb") as source:
                shutil.copyfileobj(source, out, 1 << 20)
            os.utime(dest, ns=(info.st_atime_ns, info.st_mtime_ns))
    finally:
        os.close(fd)


def _layout(root: Path, spec: JobSpec) -> Layout:
    return Layout(root, spec.checkpoint_local_path)


def _store_archive(source_dir: Path, archive: Path, uri: str, storage: Storage) -> None:
    try:
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted(source_dir.rglob("*")):  # sorted: the same files make the same archive
                tar.add(path, arcname=path.relative_to(source_dir).as_posix(), recursive=False)
        storage.upload_file(archive, uri)
    finally:
        archive.unlink(missing_ok=True)


def _fetch_code(script: ScriptMode, layout: Layout, storage: Storage) -> int:
    """Fetch the script-mode tarball and unpack it into the code directory. Returns the files unpacked."""
    layout.scratch_dir.mkdir(parents=True, exist_ok=True)
    archive = layout.scratch_dir / "sourcedir.tar.gz"
    try:
        storage.download_file(script.submit_directory, archive)
        return _unpack(archive, layout.code_dir, script.submit_directory)
    finally:
        archive.unlink(missing_ok=True)


def _unpack(archive: Path, dest: Path, uri: str) -> int:
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            # The "data" filter refuses absolute paths, '..', links out of dest and device files.
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise StorageError(uri, f"cannot unpack the source archive: {error}") from error
    return sum(1 for member in members if member.isfile())


def _write_json_atomically(path: Path, content: Any) -> None:
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(content, out, indent=2, sort_keys=True)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
