"""One instance's directory tree: made and filled before the process starts, emptied into storage after.

``prepare`` makes the tree of :mod:`hyperplan.training.contract`, writes the config files, fetches every
channel, restores checkpoints from CheckpointConfig's URI (a restarted job finds its last ones) and, in
script mode, unpacks the code. ``sync_checkpoints`` is called by the runner while the job runs and once
more when it ends; ``pack_model`` stores the model (and non-empty output data) when it has succeeded.

A root may be reused for a restart: files are overwritten, never deleted. Every storage failure is a
:class:`~hyperplan.objects.uris.StorageError` naming the URI; a job that cannot run at all is a
:class:`~hyperplan.training.contract.NoCommand` or ``UnsupportedInput``, raised before any I/O.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import StorageError, join_uri
from hyperplan.training.contract import Contract, JobSpec, Layout, ScriptMode, build_contract

MODEL_ARCHIVE = "model.tar.gz"
OUTPUT_ARCHIVE = "output.tar.gz"


@dataclass(frozen=True)
class Prepared:
    """A ready tree: the contract to start the process with, and what was fetched into it."""

    contract: Contract
    channel_files: dict[str, int]
    restored_checkpoints: int
    code_files: int


def prepare(root: Path, spec: JobSpec, storage: Storage) -> Prepared:
    contract = build_contract(spec, root)
    layout = contract.layout
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
    return Prepared(contract, channel_files, restored, code_files)


def restore_checkpoints(root: Path, spec: JobSpec, storage: Storage) -> int:
    """Fetch the checkpoints stored so far (none on a first start); on a reused root, local files newer
    than the stored ones are kept. Returns how many files were fetched."""
    if not spec.checkpoint_uri:
        return 0
    return storage.sync_dir_from(spec.checkpoint_uri, _layout(root, spec).checkpoint_dir)


def sync_checkpoints(root: Path, spec: JobSpec, storage: Storage) -> int:
    """Store the new and changed checkpoint files. Returns how many were uploaded."""
    checkpoint_dir = _layout(root, spec).checkpoint_dir
    if not spec.checkpoint_uri or not checkpoint_dir.is_dir():
        return 0
    return storage.sync_dir_to(checkpoint_dir, spec.checkpoint_uri)


def model_uri(spec: JobSpec) -> str:
    return join_uri(spec.output_path, spec.job_name, "output", MODEL_ARCHIVE)


def output_data_uri(spec: JobSpec) -> str:
    return join_uri(spec.output_path, spec.job_name, "output", OUTPUT_ARCHIVE)


def pack_model(root: Path, spec: JobSpec, storage: Storage) -> str:
    """Store the model directory as OUTPUT_PATH/JOB_NAME/output/model.tar.gz (files at the archive's top,
    as SageMaker does) and output/data, if it holds anything, as output.tar.gz. Returns the model's URI.
    With several instances, call it for the first host only."""
    layout = _layout(root, spec)
    layout.scratch_dir.mkdir(parents=True, exist_ok=True)
    if layout.output_data_dir.is_dir() and any(layout.output_data_dir.iterdir()):
        _store_archive(
            layout.output_data_dir, layout.scratch_dir / OUTPUT_ARCHIVE, output_data_uri(spec), storage
        )
    uri = model_uri(spec)
    layout.model_dir.mkdir(parents=True, exist_ok=True)
    _store_archive(layout.model_dir, layout.scratch_dir / MODEL_ARCHIVE, uri, storage)
    return uri


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
