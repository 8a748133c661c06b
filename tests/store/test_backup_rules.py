"""What `hyperplan backup` and `restore` refuse, on a real SQLite store (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplan.errors import MasterKeyUnavailable, ValidationError
from hyperplan.services.accounts import sealed_secrets
from hyperplan.store.backup import MANIFEST, backup, restore
from hyperplan.store.db import Database
from hyperplan.store.master_key import KEY_FILE_NAME, SecretBox
from hyperplan.store.urls import sqlite_url


def _store(data_dir: Path) -> None:
    data_dir.mkdir()
    database = Database(sqlite_url(data_dir))
    database.migrate()
    sealed_secrets.unlock(database, data_dir / KEY_FILE_NAME)  # seals the store under a new key file
    database.close()


def test_backup_and_restore_refuse_what_they_cannot_use(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    _store(data_dir)
    with pytest.raises(ValidationError, match="holds no SQLite store"):
        backup(tmp_path / "nowhere", tmp_path / "b0")
    other_key = tmp_path / "other.key"
    SecretBox.create(other_key)
    with pytest.raises(MasterKeyUnavailable, match="does not open the store's secrets"):
        backup(data_dir, tmp_path / "b1", key_file=other_key)  # a key that is not this store's

    made = backup(data_dir, tmp_path / "b2")
    assert set(made.files) == {"hyperplan.db", KEY_FILE_NAME}
    with pytest.raises(ValidationError, match="is not empty"):
        backup(data_dir, tmp_path / "b2")
    (tmp_path / "b2" / MANIFEST).unlink()  # a backup cut short has no manifest
    with pytest.raises(ValidationError, match="not a complete hyperplan backup"):
        restore(tmp_path / "b2", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
