"""The fleet's buckets, each kept by its store: the one entry point for transfers."""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from hyperplan.core.bucket_rights import Right
from hyperplan.core.buckets import bucket_name_problem
from hyperplan.core.fleet import Bucket, DirectoryBucket, S3Bucket
from hyperplan.objects.base import BucketStore
from hyperplan.objects.directory import DirectoryStore, local_path, resolves_inside
from hyperplan.objects.uris import (
    SCHEME,
    TEMP_PREFIX,
    StorageError,
    StoredObject,
    check_key,
    parse_s3_uri,
)


def check_bucket_name(name: str) -> bool:
    return bucket_name_problem(name) is None


# -- the fleet's buckets ----------------------------------------------------------------------------------


class BucketGuard(Protocol):
    """Whose transfers a Storage makes: asked before every bucket is touched."""

    def check(self, uri: str, bucket: str, need: Right, *, held: bool) -> None:
        """Return if the account may `need` the bucket (claiming a free one it writes to first); raise
        :class:`~hyperplan.objects.uris.BucketAccessError` naming `uri` if not. `held`: whether the
        bucket is there (mapped, or a directory under the default root)."""
        ...


class Storage:
    """The fleet's buckets. ``buckets`` maps bucket names to where they are kept (the fleet file's
    ``[buckets]``: a :class:`DirectoryBucket` or an :class:`S3Bucket`; a plain path means a directory),
    ``default_root`` holds every other bucket (``DATA_DIR/s3``), and ``backends`` adds buckets served by
    something else under the same interface.

    A Storage made for an account (:meth:`for_account`) asks its guard before every read (listing,
    download) and every write (upload) of each bucket, so that no transfer made for the account uses a
    bucket it may not."""

    def __init__(
        self,
        buckets: Mapping[str, Bucket | str | os.PathLike[str]],
        default_root: Path,
        backends: Mapping[str, BucketStore] | None = None,
        guard: BucketGuard | None = None,
    ) -> None:
        self._mapped = {name: _as_bucket(where) for name, where in buckets.items()}
        self._default_root = Path(default_root)
        self._backends = dict(backends or {})
        self._guard = guard

    def for_account(self, guard: BucketGuard) -> Storage:
        """The same buckets, each transfer checked by `guard` (the account's rights)."""
        return Storage(self._mapped, self._default_root, self._backends, guard)

    def holds(self, bucket: str) -> bool:
        """Whether the bucket is there: mapped by the fleet file, or a directory under the default root.
        A default-root bucket that is not is free, and the first write creates it."""
        if not self._created_on_write(bucket):
            return True
        return self.default_directory(bucket).is_dir()

    def default_directory(self, bucket: str) -> Path:
        """Where a bucket the fleet file does not map is kept."""
        return self._default_root / bucket

    def mapped(self) -> Mapping[str, Bucket]:
        return dict(self._mapped)

    def default_buckets(self) -> builtins.list[str]:
        """The directories under the default root, by name (those that make valid bucket names)."""
        if not self._default_root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self._default_root.iterdir()
            if entry.is_dir() and not entry.is_symlink() and check_bucket_name(entry.name)
        )

    def _open(self, uri: str, need: Right) -> tuple[BucketStore, str, str]:
        """The store of the bucket `uri` names, once the guard (if any) allowed `need`; and bucket, key."""
        bucket, key = parse_s3_uri(uri)
        if self._guard is not None:
            self._guard.check(uri, bucket, need, held=self.holds(bucket))
        return self.backend(bucket), bucket, key

    @classmethod
    def in_data_dir(cls, data_dir: Path, buckets: Mapping[str, Bucket]) -> Storage:
        """The service's storage: mapped buckets where the fleet file says, the rest in DATA_DIR/s3."""
        return cls(buckets, Path(data_dir) / "s3")

    def backend(self, bucket: str) -> BucketStore:
        if bucket in self._backends:
            return self._backends[bucket]
        where = self._mapped.get(bucket)
        if isinstance(where, S3Bucket):
            # boto3 only where a bucket lives on an S3 endpoint: importing it is a tenth of the server's
            # start-up, and most fleets map no such bucket.
            from hyperplan.objects.s3 import S3Store

            return S3Store(bucket, where)
        if isinstance(where, DirectoryBucket):
            return DirectoryStore(bucket, Path(where.path), create_on_write=False)
        return DirectoryStore(bucket, self._default_root / bucket, create_on_write=True)

    def _created_on_write(self, bucket: str) -> bool:
        return bucket not in self._backends and bucket not in self._mapped

    def exists(self, uri: str) -> bool:
        """True if the URI names an object (not a prefix). A missing bucket is an error, not False."""
        backend, _, key = self._open(uri, Right.READ)
        return backend.head(key) is not None

    def list(self, uri_prefix: str) -> builtins.list[StoredObject]:
        """The objects under a prefix (a directory of keys), in key order."""
        backend, _, key = self._open(uri_prefix, Right.READ)
        return builtins.list(backend.objects_under(key))

    def download_prefix(self, uri: str, dest_dir: Path, shard: tuple[int, int] | None = None) -> int:
        """Copy every object under ``uri`` into ``dest_dir``, keeping paths relative to the prefix; if
        ``uri`` names one object, copy just it, as ``dest_dir/<its name>``. ``shard=(i, n)`` keeps every
        n-th object from the i-th, in key order (SageMaker's ShardedByS3Key). Returns the number copied."""
        selected = self._objects_for(uri)
        if shard is not None:
            index, count = shard
            selected = selected[index::count]
        for item, relative in selected:
            self.backend(item.bucket).get(item.key, local_path(Path(dest_dir), relative, item.uri))
        return len(selected)

    def sync_dir_from(self, uri_prefix: str, dest_dir: Path) -> int:
        """Copy the objects under the prefix that ``dest_dir`` lacks or holds an older copy of (by
        modification time), so that newer local files are never overwritten. Returns the number copied.
        A default-root bucket that nothing has been written to yet holds nothing (a first start's
        checkpoints); any other missing bucket is an error."""
        backend, bucket, _ = self._open(uri_prefix, Right.READ)
        if self._created_on_write(bucket) and not backend.bucket_exists():
            return 0
        copied = 0
        for item, relative in self._objects_for(uri_prefix):
            local = local_path(Path(dest_dir), relative, item.uri)
            with contextlib.suppress(FileNotFoundError):
                if local.stat().st_mtime_ns >= item.mtime_ns:
                    continue
            self.backend(item.bucket).get(item.key, local)
            copied += 1
        return copied

    def _objects_for(self, uri: str) -> builtins.list[tuple[StoredObject, str]]:
        """The object the URI names, or else those under it as a prefix, each with its relative path."""
        backend, _, key = self._open(uri, Right.READ)
        single = backend.head(key)
        if single is not None:
            return [(single, key.rsplit("/", 1)[-1])]
        prefix = key.rstrip("/")
        return [(item, item.key[len(prefix) :].lstrip("/")) for item in backend.objects_under(prefix)]

    def download_file(self, uri: str, dest: Path) -> None:
        """Copy the object ``uri`` to the file ``dest``."""
        backend, _, key = self._open(uri, Right.READ)
        backend.get(key, Path(dest))

    def upload_file(self, path: Path, uri: str) -> None:
        """Store one local file as the object ``uri``."""
        backend, _, key = self._open(uri, Right.WRITE)
        if not key or key.endswith("/"):
            raise StorageError(uri, "an object needs a key that does not end with '/'")
        self._put(backend, Path(path), key, uri)

    def upload_dir(self, src_dir: Path, uri_prefix: str) -> int:
        """Store every file under ``src_dir`` below the prefix, keeping relative paths. Returns the count."""
        return self._upload_tree(src_dir, uri_prefix, only_changed=False)

    def sync_dir_to(self, src_dir: Path, uri_prefix: str) -> int:
        """Store the files under ``src_dir`` that are new or changed since the stored copy: a different
        size or modification time (uploads keep the file's mtime), rsync's quick check. So a file
        rewritten with the same size within one tick of the filesystem's clock after a sync is missed
        until it changes again. Nothing is deleted. Returns the number uploaded."""
        return self._upload_tree(src_dir, uri_prefix, only_changed=True)

    def _upload_tree(self, src_dir: Path, uri_prefix: str, *, only_changed: bool) -> int:
        backend, bucket, prefix = self._open(uri_prefix, Right.WRITE)
        prefix = prefix.rstrip("/")
        stored: dict[str, StoredObject] = {}
        if only_changed and backend.bucket_exists():
            stored = {item.key: item for item in backend.objects_under(prefix)}
        uploaded = 0
        for path in sorted(Path(src_dir).rglob("*")):
            if path.name.startswith(TEMP_PREFIX) or not path.is_file():
                continue
            key = "/".join(filter(None, [prefix, path.relative_to(src_dir).as_posix()]))
            check_key(f"{SCHEME}{bucket}/{key}", key)
            if not resolves_inside(path, Path(src_dir)):
                raise StorageError(
                    f"{SCHEME}{bucket}/{key}", f"{path} is a symbolic link that leads outside {src_dir}"
                )
            try:
                stat = path.stat()
                previous = stored.get(key)
                if previous and previous.size == stat.st_size and previous.mtime_ns == stat.st_mtime_ns:
                    continue
                backend.put(path, key)
            except (FileNotFoundError, StorageError):
                # A file renamed away since the listing (a training script's temporary file) is skipped;
                # any other failure is real.
                if path.exists():
                    raise
                continue
            uploaded += 1
        return uploaded

    def _put(self, backend: BucketStore, path: Path, key: str, uri: str) -> None:
        if path.is_symlink():
            raise StorageError(uri, f"cannot upload {path}: a symbolic link, not followed")
        if not path.is_file():
            raise StorageError(uri, f"cannot upload {path}: not a file")
        backend.put(path, key)


def _as_bucket(where: Bucket | str | os.PathLike[str]) -> Bucket:
    if isinstance(where, (DirectoryBucket, S3Bucket)):
        return where
    return DirectoryBucket(os.fspath(where))
