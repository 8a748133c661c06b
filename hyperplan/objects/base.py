"""What keeps one bucket's objects: a directory, or a bucket on an S3-compatible endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from hyperplan.objects.uris import (
    StoredObject,
)


class BucketStore(Protocol):
    """Where one bucket's objects live. Keys are already checked; errors are StorageErrors naming URIs."""

    def bucket_exists(self) -> bool:
        """Whether the bucket is there to read from."""
        ...

    def head(self, key: str) -> StoredObject | None:
        """The object with exactly this key, or None."""
        ...

    def objects_under(self, prefix: str) -> Iterator[StoredObject]:
        """Every object whose key lies under the directory ``prefix`` ("" = the whole bucket)."""
        ...

    def get(self, key: str, dest: Path) -> None:
        """Copy the object to ``dest`` atomically, giving ``dest`` the object's modification time."""
        ...

    def put(self, src: Path, key: str) -> None:
        """Store the file ``src`` as the object, atomically, keeping the file's modification time (an
        S3 backend keeps it in the object's metadata and reports it as ``mtime_ns``: LastModified is the
        upload time, in whole seconds, and cannot tell a changed file from an unchanged one)."""
        ...
