"""Backup and restore of a data directory whose store is SQLite: ``hyperplan backup DEST``, ``restore SRC``.

A backup is taken while the server runs. The database is copied with SQLite's online backup API in one
step, which reads one snapshot of the store: every transaction committed before the copy started is in
it, whole, and none that committed after (WAL keeps the server writing meanwhile; a writer is never
blocked by the copy). Then the key file that seals the store's secrets is copied, and checked to open
the copied store (a rotation of the master key between the two copies would make a pair that does not
match: the backup is then taken again). The administrator's credentials file and the buckets' objects
(``DATA_DIR/s3``) are copied as they are at that moment: objects are not part of the snapshot.

The backup's manifest, ``BACKUP.json``, is written last: a directory without it is not a backup (one cut
short), and restore refuses it. Restore puts a backup into an empty (or new) data directory, 0700, each
file 0600; a server started there has every plan that was acknowledged before the backup began.

A PostgreSQL store is backed up with PostgreSQL's own tools (pg_dump; docs/POSTGRES.md); this module
refuses a data directory without a SQLite store, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hyperplan.errors import MasterKeyUnavailable, ValidationError
from hyperplan.store.master_key import KEY_FILE_NAME, SecretBox

DATABASE = "hyperplan.db"
CREDENTIALS = "credentials"
OBJECTS = "s3"
MANIFEST = "BACKUP.json"
_CHECK_SETTING = "secrets.master_key_check"  # store/settings.MASTER_KEY_CHECK (settings imports the ORM)
_TRIES = 3


@dataclass(frozen=True)
class Backup:
    directory: Path
    taken_at: datetime
    files: tuple[str, ...]


def backup(data_dir: Path, dest: Path, key_file: Path | None = None) -> Backup:
    """Copy the store, key file, credentials and objects of `data_dir` into the new directory `dest`."""
    source = data_dir / DATABASE
    key_path = key_file if key_file is not None else data_dir / KEY_FILE_NAME
    if not source.is_file():
        raise ValidationError(
            f"{data_dir} holds no SQLite store ({DATABASE}): is it the data directory? A server whose store "
            "is PostgreSQL is backed up with pg_dump, and its key file copied beside the dump "
            "(docs/POSTGRES.md)."
        )
    _require_empty(dest, "backup destination")
    dest.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(dest, 0o700)
    started = datetime.now(UTC)
    for attempt in range(_TRIES):
        _copy_database(source, dest / DATABASE)
        has_key = key_path.is_file()
        if has_key:
            _copy_file(key_path, dest / KEY_FILE_NAME)
        if not has_key or _key_opens(dest / KEY_FILE_NAME, dest / DATABASE):
            break
        if attempt == _TRIES - 1:
            raise MasterKeyUnavailable(
                f"The key file {key_path} does not open the store's secrets: back up with the key file "
                "the server uses (--key-file)."
            )
    files = [DATABASE, *([KEY_FILE_NAME] if has_key else [])]
    if (data_dir / CREDENTIALS).is_file():
        _copy_file(data_dir / CREDENTIALS, dest / CREDENTIALS)
        files.append(CREDENTIALS)
    if (data_dir / OBJECTS).is_dir():
        shutil.copytree(data_dir / OBJECTS, dest / OBJECTS, symlinks=True)
        files.append(OBJECTS)
    manifest = {"format": 1, "taken_at": started.isoformat(), "files": files}
    _write(dest / MANIFEST, json.dumps(manifest, indent=2).encode() + b"\n")
    _sync_directory(dest)
    return Backup(dest, started, tuple(files))


def restore(src: Path, data_dir: Path, key_file: Path | None = None) -> Backup:
    """Put the backup in `src` into `data_dir`, which must be empty or not exist yet."""
    try:
        manifest = json.loads((src / MANIFEST).read_text())
        files = tuple(str(name) for name in manifest["files"])
        taken_at = datetime.fromisoformat(manifest["taken_at"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ValidationError(
            f"{src} is not a complete hyperplan backup: it has no readable {MANIFEST} (a backup cut short "
            "has none)."
        ) from None
    if DATABASE not in files or not (src / DATABASE).is_file():
        raise ValidationError(f"{src} is not a complete hyperplan backup: {DATABASE} is missing.")
    _require_empty(data_dir, "data directory to restore into")
    key_target = key_file if key_file is not None else data_dir / KEY_FILE_NAME
    if KEY_FILE_NAME in files and key_target.exists():
        raise ValidationError(f"the key file {key_target} already exists; restore will not overwrite it.")
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    _copy_file(src / DATABASE, data_dir / DATABASE)
    if KEY_FILE_NAME in files:
        _copy_file(src / KEY_FILE_NAME, key_target)
    if CREDENTIALS in files:
        _copy_file(src / CREDENTIALS, data_dir / CREDENTIALS)
    if OBJECTS in files:
        shutil.copytree(src / OBJECTS, data_dir / OBJECTS, symlinks=True)
    _sync_directory(data_dir)
    return Backup(data_dir, taken_at, files)


def _require_empty(directory: Path, what: str) -> None:
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValidationError(f"the {what} {directory} is not empty; give a new or empty directory.")


def _copy_database(source: Path, target: Path) -> None:
    """One snapshot of the live store, copied page by page in a single step (sqlite3's backup API)."""
    target.unlink(missing_ok=True)
    reader = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    try:
        writer = sqlite3.connect(target)
        try:
            reader.backup(writer)  # pages=-1: the whole database under one read transaction
            writer.execute("PRAGMA journal_mode=DELETE")  # the copy is one self-contained file
            checked = writer.execute("PRAGMA quick_check").fetchone()[0]
            if checked != "ok":
                raise ValidationError(f"the copy of {source} failed SQLite's check: {checked}")
        finally:
            writer.close()
    finally:
        reader.close()
    os.chmod(target, 0o600)
    _fsync(target)


def _key_opens(key_path: Path, database: Path) -> bool:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        row = connection.execute("SELECT value FROM settings WHERE key = ?", (_CHECK_SETTING,)).fetchone()
    finally:
        connection.close()
    if row is None:
        return True  # a store with no sealed secret yet
    try:
        return SecretBox.load(key_path).opens(row[0])
    except MasterKeyUnavailable:
        return False


def _copy_file(source: Path, target: Path) -> None:
    _write(target, source.read_bytes())


def _write(target: Path, content: bytes) -> None:
    with open(target, "wb", opener=lambda path, flags: os.open(path, flags, 0o600)) as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(target, 0o600)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _sync_directory(directory: Path) -> None:
    _fsync(directory)
