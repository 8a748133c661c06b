"""A bucket that is a directory on storage the nodes share."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from hyperplan.objects.uris import (
    SCHEME,
    TEMP_PREFIX,
    StorageError,
    StoredObject,
)


class DirectoryStore:
    """A bucket that is a directory: key ``a/b.csv`` is the file ``ROOT/a/b.csv``."""

    def __init__(self, bucket: str, root: Path, *, create_on_write: bool) -> None:
        self.bucket = bucket
        self.root = root
        # Default-root buckets come into being with their first object; a mapped directory is the
        # administrator's, and a missing one is a mistake to report, not to paper over.
        self.create_on_write = create_on_write

    def uri(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{key}"

    def bucket_exists(self) -> bool:
        with self._errors(""):
            return self.root.is_dir()

    def head(self, key: str) -> StoredObject | None:
        with self._errors(key):
            self._require_bucket(key)
            path = self._inside(key)
            if not key or key.endswith("/") or not path.is_file():
                return None
            return self._describe(key, path.stat())

    def objects_under(self, prefix: str) -> Iterator[StoredObject]:
        with self._errors(prefix):
            self._require_bucket(prefix)
            top = self._inside(prefix.rstrip("/"))
            if not top.is_dir():
                return
            # os.walk does not descend into symbolic links to directories; links to files are checked.
            for directory, subdirs, files in os.walk(top, onerror=_raise):
                subdirs.sort()  # walk in key order, so listings are stable
                for name in sorted(files):
                    if name.startswith(TEMP_PREFIX):
                        continue
                    path = Path(directory, name)
                    key = path.relative_to(self.root).as_posix()
                    self._inside(key)
                    with contextlib.suppress(FileNotFoundError):  # deleted while we walked
                        yield self._describe(key, path.stat())

    def get(self, key: str, dest: Path) -> None:
        with self._errors(key):
            self._require_bucket(key)
            source = self._inside(key)
            if not source.is_file():
                raise StorageError(self.uri(key), "no such object")
            _atomic_copy(source, dest)

    def put(self, src: Path, key: str) -> None:
        with self._errors(key):
            if not self.root.is_dir():
                if not self.create_on_write:
                    reason = f"bucket {self.bucket!r} is mapped to {self.root}, which is not a directory"
                    raise StorageError(self.uri(key), reason)
                self.root.mkdir(parents=True, exist_ok=True)
            _atomic_copy(src, self._inside(key))

    def _inside(self, key: str) -> Path:
        """The path of `key` (or of the prefix `key`), refused if a symbolic link on its way leads
        outside the bucket's directory: the link is not followed."""
        path = self.root / key if key else self.root
        if not resolves_inside(path, self.root):
            raise StorageError(self.uri(key), "a symbolic link in the bucket leads outside it; not followed")
        return path

    def _require_bucket(self, key: str) -> None:
        if not self.root.is_dir():
            raise StorageError(self.uri(key), f"no such bucket {self.bucket!r} (no directory {self.root})")

    def _describe(self, key: str, stat: os.stat_result) -> StoredObject:
        return StoredObject(self.bucket, key, stat.st_size, stat.st_mtime_ns)

    @contextlib.contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        """Turn filesystem failures into StorageErrors that name the URI."""
        try:
            yield
        except OSError as error:
            raise StorageError(self.uri(key), os_reason(error)) from error


def resolves_inside(path: Path, root: Path) -> bool:
    """Whether `path`, every symbolic link on its way followed, stays in `root` (itself resolved: an
    administrator may map a bucket through a link). A path not there yet resolves as far as it exists."""
    real_root = root.resolve()
    resolved = path.resolve()
    return resolved == real_root or resolved.is_relative_to(real_root)


def local_path(base: Path, relative: str, uri: str) -> Path:
    """`base/relative` for a download, refused if a symbolic link there leads outside `base`."""
    path = Path(base, relative)
    if not resolves_inside(path, Path(base)):
        raise StorageError(uri, f"a symbolic link in {base} leads outside it; not followed")
    return path


def os_reason(error: OSError) -> str:
    if isinstance(error, PermissionError):
        return f"access denied ({error.strerror}: {error.filename})"
    if isinstance(error, NotADirectoryError):
        return f"part of the key is an object, not a directory ({error.filename})"
    if isinstance(error, IsADirectoryError):
        return f"the key is a directory ({error.filename})"
    return f"{error.strerror or error} ({error.filename})"


def _raise(error: OSError) -> None:
    """os.walk ignores errors unless told otherwise; an unreadable directory must not look empty (one
    deleted while we walk is simply gone)."""
    if not isinstance(error, FileNotFoundError):
        raise error


def _atomic_copy(source: Path, dest: Path) -> None:
    """Copy ``source`` to ``dest`` through a temporary file beside ``dest``, keeping the mtime."""
    with source.open("rb") as src:
        atomic_write(dest, lambda out: shutil.copyfileobj(src, out, 1 << 20), lambda: _times(source.stat()))


def _times(stat: os.stat_result) -> tuple[int, int]:
    return (stat.st_atime_ns, stat.st_mtime_ns)


def atomic_write(
    dest: Path, fill: Callable[[IO[bytes]], object], times: Callable[[], tuple[int, int]]
) -> None:
    """Write ``dest`` through a temporary file beside it, then give it ``times()`` (atime, mtime in ns):
    the copy keeps its source's mtime so that a later sync sees it as unchanged."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=dest.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        os.utime(temp_name, ns=times())
        os.chmod(temp_name, 0o644)
        os.replace(temp_name, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
