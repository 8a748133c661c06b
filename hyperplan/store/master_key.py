"""The master key file and the secrets sealed under it.

The store keeps access-key secrets, webhook signing secrets and registry passwords as Fernet tokens: a
copy of the database file alone reveals none of them. The key lives in a file only the server reads
(`DATA_DIR/master.key` by default, mode 0600), one Fernet key a line. The first line seals; every line
opens. A rotation writes the new key above the old one, re-seals every secret in one transaction, then
drops the old line: a crash at any point leaves a file that opens whatever the store holds.

Several servers on one database share the file. A server that meets a token its keys cannot open reads
the file again before it gives up, and one that seals reads it again when it changed: a rotation by
another server reaches it at its next use of a secret.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from hyperplan.errors import MasterKeyUnavailable

KEY_FILE_NAME = "master.key"
_FILE_MODE = 0o600


class SecretBox:
    """Seals and opens secrets with the keys of one key file, following that file when it changes."""

    def __init__(self, path: Path, keys: list[bytes]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._keys = keys
        self._cipher = _cipher(keys)
        self._seen = _file_identity(path)
        self.rotating = threading.Lock()  # one rotation at a time (services/accounts/sealed_secrets.py)

    @classmethod
    def load(cls, path: Path) -> SecretBox:
        return cls(path, read_key_file(path))

    @classmethod
    def create(cls, path: Path) -> SecretBox:
        """A new key file with one new key; refused if the file already exists."""
        keys = [new_key()]
        write_key_file(path, keys, exclusive=True)
        return cls(path, keys)

    @property
    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._keys)

    def seal(self, secret: str) -> str:
        return self._current().encrypt(secret.encode("utf-8")).decode("ascii")

    def open(self, token: str) -> str:
        """The secret sealed in `token`; raises MasterKeyUnavailable if no key of the file opens it."""
        try:
            return self._current().decrypt(token.encode("ascii")).decode("utf-8")
        except InvalidToken:
            pass
        try:  # another server may have rotated the key since this one last read the file
            return self._reload().decrypt(token.encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise MasterKeyUnavailable(
                f"The master key file {self.path} does not open a secret of this store."
            ) from None

    def opens(self, token: str) -> bool:
        try:
            self.open(token)
        except MasterKeyUnavailable:
            return False
        return True

    def reseal(self, token: str) -> str:
        """`token` sealed again under the file's first key (it must open under one of the file's keys)."""
        return self._current().rotate(token.encode("ascii")).decode("ascii")

    def use_keys(self, keys: list[bytes]) -> None:
        """Write `keys` to the file (atomically) and seal with the first from now on."""
        write_key_file(self.path, keys)
        with self._lock:
            self._keys, self._cipher = list(keys), _cipher(keys)
            self._seen = _file_identity(self.path)

    def _current(self) -> MultiFernet:
        with self._lock:
            changed = _file_identity(self.path) != self._seen
            cipher = self._cipher
        return self._reload() if changed else cipher

    def _reload(self) -> MultiFernet:
        try:
            keys = read_key_file(self.path)
        except MasterKeyUnavailable:
            with self._lock:  # keep the keys in memory: the file may be in the middle of a rename
                return self._cipher
        with self._lock:
            self._keys, self._cipher = keys, _cipher(keys)
            self._seen = _file_identity(self.path)
            return self._cipher


def new_key() -> bytes:
    return Fernet.generate_key()


def _cipher(keys: list[bytes]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


def read_key_file(path: Path) -> list[bytes]:
    """The keys of a key file, first (sealing) key first; MasterKeyUnavailable with the reason if the file
    cannot be read or holds no valid key."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise MasterKeyUnavailable(f"The master key file {path} does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise MasterKeyUnavailable(f"Cannot read the master key file {path}: {reason}.") from None
    keys = [line.strip().encode("ascii") for line in text.splitlines() if line.strip()]
    if not keys:
        raise MasterKeyUnavailable(f"The master key file {path} holds no key.")
    for number, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except ValueError:
            raise MasterKeyUnavailable(
                f"Line {number} of the master key file {path} is not a Fernet key "
                "(32 url-safe base64-encoded bytes)."
            ) from None
    return keys


def readable_by_others(path: Path) -> bool:
    return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def write_key_file(path: Path, keys: list[bytes], *, exclusive: bool = False) -> None:
    """Write the keys, mode 0600, so that a reader sees the old file or the new one, never a part of one.
    `exclusive`: refuse if the file exists (two servers making a store's first key at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = b"".join(key + b"\n" for key in keys)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            os.link(temporary, path)  # fails with FileExistsError if another server made one first
            temporary.unlink()
        else:
            temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
