"""Objects named by ``s3://BUCKET/KEY`` URIs, kept wherever the fleet file says.

SageMaker URIs stay ``s3://`` on the wire. Behind them, each bucket is served by a :class:`Backend`:

* a bucket the fleet file's ``[buckets]`` maps to a directory lives there, and the directory must exist;
* a bucket it maps to an S3-compatible endpoint lives there (:class:`S3Backend`, through boto3), as the
  remote bucket it names; that bucket must exist, hyperplan never creates one;
* any other bucket lives in ``DEFAULT_ROOT/BUCKET`` (``DATA_DIR/s3/BUCKET``, on a filesystem the nodes
  share); it is created by the first write and is "no such bucket" to reads until then.

A key is a path under its bucket: ``/`` separates directories, and "prefixes" are whole directories
(``s3://b/data/train`` covers ``data/train/...``, never ``data/training.csv``), which is what SageMaker's
``S3Prefix`` channels and checkpoint locations mean in practice. Bucket names follow S3's rules and keys
with ``.`` or ``..`` segments, empty segments, NUL bytes or encoded dots and slashes are refused
(hyperplan/core/buckets.py), so a URI can never name a file outside its bucket; and no symbolic link is
followed out of a bucket's directory, nor out of a local directory being uploaded or downloaded into
(paths are checked once resolved).

Every write is atomic per file (a hidden temporary file in the same directory, then a rename; on S3, a PUT
or a completed multipart upload), so a reader sees either the old object or the new one, never half of
one. Every failure is a :class:`StorageError` whose message starts with the URI (the ``s3://`` URI the job
named, not the remote bucket's), ready to become a job's FailureReason or a node's message.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Protocol

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from hyperplan.core.buckets import bucket_name_problem, key_problem
from hyperplan.core.fleet import Bucket, DirectoryBucket, S3Bucket

SCHEME = "s3://"
TEMP_PREFIX = ".hyperplan-tmp-"
"""Names of files being written; never listed, so a half-written object is never seen."""


class StorageError(Exception):
    """A storage operation failed; ``uri`` names the object or prefix, and the message starts with it."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"{uri}: {reason}")
        self.uri = uri
        self.reason = reason


@dataclass(frozen=True)
class StoredObject:
    """One object: its key in its bucket, its size in bytes and its modification time (ns since epoch)."""

    bucket: str
    key: str
    size: int
    mtime_ns: int

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``; the key may be empty or end with ``/``."""
    if not uri.startswith(SCHEME):
        raise StorageError(uri, "not an s3:// URI")
    bucket, _, key = uri[len(SCHEME) :].partition("/")
    if not bucket:
        raise StorageError(uri, "the URI names no bucket")
    check_bucket(uri, bucket)
    check_key(uri, key)
    return bucket, key


def check_bucket(uri: str, bucket: str) -> None:
    """Refuse bucket names S3 would refuse: among them any that could name a directory outside the
    buckets' root (`..`, `.`, a name with `/`)."""
    problem = bucket_name_problem(bucket)
    if problem is not None:
        raise StorageError(uri, problem)


def check_key(uri: str, key: str) -> None:
    """Refuse keys that could leave their bucket's directory or that a directory cannot hold."""
    problem = key_problem(key)
    if problem is not None:
        raise StorageError(uri, problem)


def join_uri(prefix: str, *parts: str) -> str:
    """``join_uri("s3://b/out/", "job", "model.tar.gz")`` -> ``s3://b/out/job/model.tar.gz``."""
    pieces = [prefix.rstrip("/"), *(part.strip("/") for part in parts)]
    return "/".join(piece for piece in pieces if piece)


class Backend(Protocol):
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


class DirectoryBackend:
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
        if not _resolves_inside(path, self.root):
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
            raise StorageError(self.uri(key), _os_reason(error)) from error


def _resolves_inside(path: Path, root: Path) -> bool:
    """Whether `path`, every symbolic link on its way followed, stays in `root` (itself resolved: an
    administrator may map a bucket through a link). A path not there yet resolves as far as it exists."""
    real_root = root.resolve()
    resolved = path.resolve()
    return resolved == real_root or resolved.is_relative_to(real_root)


def _local_path(base: Path, relative: str, uri: str) -> Path:
    """`base/relative` for a download, refused if a symbolic link there leads outside `base`."""
    path = Path(base, relative)
    if not _resolves_inside(path, Path(base)):
        raise StorageError(uri, f"a symbolic link in {base} leads outside it; not followed")
    return path


def _os_reason(error: OSError) -> str:
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
        _atomic_write(dest, lambda out: shutil.copyfileobj(src, out, 1 << 20), lambda: _times(source.stat()))


def _times(stat: os.stat_result) -> tuple[int, int]:
    return (stat.st_atime_ns, stat.st_mtime_ns)


def _atomic_write(
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


# -- buckets on an S3-compatible endpoint -----------------------------------------------------------------

MTIME_METADATA = "hyperplan-mtime-ns"
"""The object metadata key (``x-amz-meta-hyperplan-mtime-ns``) holding the uploaded file's mtime in ns:
LastModified is the upload time, in whole seconds, and cannot tell a changed file from an unchanged one."""

_CLIENT_CONFIG = Config(
    # Path-style URLs (endpoint/bucket/key) are what every S3-compatible server accepts; virtual hosts
    # (bucket.endpoint) need wildcard DNS that a self-hosted endpoint rarely has.
    s3={"addressing_style": "path"},
    # A dead endpoint must fail a job in seconds, not after botocore's default minute-long waits.
    connect_timeout=5,
    read_timeout=60,
    retries={"mode": "standard", "max_attempts": 3},
    # Since boto3 1.36 every upload carries a CRC checksum by default, which some S3-compatible servers
    # refuse; send checksums only where the API requires them.
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
)

_HEAD_WORKERS = 8
"""HEAD requests in flight while listing: a listing does not carry metadata, so each object's is fetched."""

_DENIED_CODES = frozenset(
    {"AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_clients: dict[tuple[str, str, str | None, str | None], Any] = {}
_clients_lock = threading.Lock()


def _s3_client(config: S3Bucket, credentials: tuple[str | None, str | None]) -> Any:
    """One client per endpoint, region and key pair, shared: the services build a Storage for every
    transfer, and making a client costs tens of milliseconds. boto3 clients are thread-safe."""
    cache_key = (config.endpoint_url, config.region, *credentials)
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is None:
            # A session of its own: the default session is shared process state, and not thread-safe.
            session = boto3.session.Session(
                aws_access_key_id=credentials[0], aws_secret_access_key=credentials[1]
            )
            client = session.client(
                "s3", endpoint_url=config.endpoint_url, region_name=config.region, config=_CLIENT_CONFIG
            )
            _clients[cache_key] = client
        return client


class S3Backend:
    """A bucket on an S3-compatible endpoint: key ``a/b.csv`` is the object ``a/b.csv`` in the remote bucket
    that the fleet file names (by default the bucket's own name). ``client`` replaces the boto3 client
    that the configuration would make (tests)."""

    page_size = 1000
    """Keys per ListObjectsV2 request (S3's maximum)."""

    def __init__(self, bucket: str, config: S3Bucket, client: Any = None) -> None:
        self.bucket = bucket
        self.config = config
        self._client = client

    def uri(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{key}"

    def bucket_exists(self) -> bool:
        with self._errors(""):
            return self._bucket_exists(self._s3(""))

    def head(self, key: str) -> StoredObject | None:
        with self._errors(key):
            client = self._s3(key)
            if not key or key.endswith("/"):  # a prefix, never an object; but the bucket must exist
                self._require_bucket(client, key)
                return None
            try:
                response = client.head_object(Bucket=self.config.remote_bucket, Key=key)
            except ClientError as error:
                if _status(error) != 404:
                    raise
                # HEAD answers carry no body, so a missing bucket is a bare 404 too: ask the bucket.
                self._require_bucket(client, key)
                return None
            return self._describe(key, response)

    def objects_under(self, prefix: str) -> Iterator[StoredObject]:
        with self._errors(prefix):
            client = self._s3(prefix)
            directory = prefix.rstrip("/")
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.config.remote_bucket,
                Prefix=f"{directory}/" if directory else "",  # a whole directory, never a name's prefix
                PaginationConfig={"PageSize": self.page_size},
            )
            with ThreadPoolExecutor(_HEAD_WORKERS, thread_name_prefix="s3-head") as pool:
                for page in pages:
                    keys = [item["Key"] for item in page.get("Contents", [])]
                    # Keys ending in '/' are "folder" markers that consoles create: not objects.
                    keys = [key for key in keys if not key.endswith("/")]
                    for key in keys:
                        # Another tool may have stored keys such as "a/../b" that would leave the
                        # destination directory of a download: refuse, naming the key.
                        check_key(self.uri(key), key)
                    described = pool.map(lambda key: self._head_listed(client, key), keys)
                    yield from (item for item in described if item is not None)

    def get(self, key: str, dest: Path) -> None:
        with self._errors(key):
            response = self._s3(key).get_object(Bucket=self.config.remote_bucket, Key=key)
            mtime_ns = _mtime_ns(response)
            body = response["Body"]
            try:
                # botocore checks the length read against Content-Length, so a cut stream is an error.
                _atomic_write(dest, lambda out: _copy_stream(body, out), lambda: (mtime_ns, mtime_ns))
            finally:
                body.close()

    def put(self, src: Path, key: str) -> None:
        with self._errors(key):
            # The mtime is read before the content: a file rewritten during the upload is stored with its
            # older mtime, so the next sync sees it as changed and uploads it again.
            mtime_ns = src.stat().st_mtime_ns
            # upload_file switches to a multipart upload above 8 MB (a single PUT stops at 5 GB); the object
            # appears only when the upload completes, so readers never see part of it.
            self._s3(key).upload_file(
                str(src),
                self.config.remote_bucket,
                key,
                ExtraArgs={"Metadata": {MTIME_METADATA: str(mtime_ns)}},
            )

    def _s3(self, key: str) -> Any:
        if self._client is None:
            self._client = _s3_client(self.config, self._credentials(key))
        return self._client

    def _credentials(self, key: str) -> tuple[str | None, str | None]:
        """The key pair the fleet file gives (read from the environment now), or (None, None): the AWS
        chain."""
        config = self.config
        return (
            self._credential(key, config.access_key_id, config.access_key_id_env),
            self._credential(key, config.secret_access_key, config.secret_access_key_env),
        )

    def _credential(self, key: str, inline: str | None, variable: str | None) -> str | None:
        if variable is None:
            return inline
        value = os.environ.get(variable)
        if not value:
            raise StorageError(
                self.uri(key),
                f"the environment variable {variable}, which holds the bucket's credentials, is not set",
            )
        return value

    def _bucket_exists(self, client: Any) -> bool:
        try:
            client.head_bucket(Bucket=self.config.remote_bucket)
        except ClientError as error:
            if _status(error) == 404:
                return False
            raise
        return True

    def _require_bucket(self, client: Any, key: str) -> None:
        if not self._bucket_exists(client):
            raise StorageError(self.uri(key), self._no_such_bucket())

    def _no_such_bucket(self) -> str:
        return f"no such bucket {self.config.remote_bucket!r} at {self.config.endpoint_url}"

    def _head_listed(self, client: Any, key: str) -> StoredObject | None:
        try:
            response = client.head_object(Bucket=self.config.remote_bucket, Key=key)
        except ClientError as error:
            if _status(error) == 404:  # deleted since the listing
                return None
            raise StorageError(self.uri(key), self._reason(error)) from error
        return self._describe(key, response)

    def _describe(self, key: str, response: Mapping[str, Any]) -> StoredObject:
        return StoredObject(self.bucket, key, response["ContentLength"], _mtime_ns(response))

    @contextlib.contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        """Turn botocore and filesystem failures into StorageErrors that name the URI."""
        try:
            yield
        except StorageError:
            raise
        # Before OSError: some botocore errors (timeouts) are OSErrors too, through requests.
        except (BotoCoreError, ClientError, S3UploadFailedError) as error:
            raise StorageError(self.uri(key), self._reason(error)) from error
        except OSError as error:  # the local side: the file to upload, the directory to download into
            raise StorageError(self.uri(key), _os_reason(error)) from error

    def _reason(self, error: Exception) -> str:
        if isinstance(error, S3UploadFailedError) and isinstance(error.__context__, ClientError):
            error = error.__context__  # boto3 wraps the client's error and keeps only its text
        endpoint = self.config.endpoint_url
        if isinstance(error, ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            message = error.response.get("Error", {}).get("Message") or code or str(_status(error))
            if code == "NoSuchBucket":
                return self._no_such_bucket()
            if code == "NoSuchKey":
                return "no such object"
            if code in _DENIED_CODES or _status(error) in (401, 403):
                return f"access denied ({message})"
            return f"{code or _status(error)}: {message}"
        if isinstance(error, (BotoConnectionError, HTTPClientError)):
            return f"cannot reach {endpoint} ({error})"
        if isinstance(error, NoCredentialsError):
            return f"no credentials for {endpoint} (set access_key_id_env and secret_access_key_env)"
        return str(error)


def _status(error: ClientError) -> int | None:
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _mtime_ns(response: Mapping[str, Any]) -> int:
    """The uploaded file's mtime, from the metadata hyperplan stores; for objects other tools stored, the
    upload time."""
    stored = response.get("Metadata", {}).get(MTIME_METADATA, "")
    if stored.isdigit():
        return int(stored)
    last_modified: datetime = response["LastModified"]
    return (last_modified - _EPOCH) // timedelta(microseconds=1) * 1000


def _copy_stream(body: Any, out: IO[bytes]) -> None:
    for chunk in body.iter_chunks(1 << 20):
        out.write(chunk)


# -- the fleet's buckets ----------------------------------------------------------------------------------


class Storage:
    """The fleet's buckets. ``buckets`` maps bucket names to where they are kept (the fleet file's
    ``[buckets]``: a :class:`DirectoryBucket` or an :class:`S3Bucket`; a plain path means a directory),
    ``default_root`` holds every other bucket (``DATA_DIR/s3``), and ``backends`` adds buckets served by
    something else under the same interface."""

    def __init__(
        self,
        buckets: Mapping[str, Bucket | str | os.PathLike[str]],
        default_root: Path,
        backends: Mapping[str, Backend] | None = None,
    ) -> None:
        self._mapped = {name: _as_bucket(where) for name, where in buckets.items()}
        self._default_root = Path(default_root)
        self._backends = dict(backends or {})

    @classmethod
    def in_data_dir(cls, data_dir: Path, buckets: Mapping[str, Bucket]) -> Storage:
        """The service's storage: mapped buckets where the fleet file says, the rest in DATA_DIR/s3."""
        return cls(buckets, Path(data_dir) / "s3")

    def backend(self, bucket: str) -> Backend:
        if bucket in self._backends:
            return self._backends[bucket]
        where = self._mapped.get(bucket)
        if isinstance(where, S3Bucket):
            return S3Backend(bucket, where)
        if isinstance(where, DirectoryBucket):
            return DirectoryBackend(bucket, Path(where.path), create_on_write=False)
        return DirectoryBackend(bucket, self._default_root / bucket, create_on_write=True)

    def _created_on_write(self, bucket: str) -> bool:
        return bucket not in self._backends and bucket not in self._mapped

    def exists(self, uri: str) -> bool:
        """True if the URI names an object (not a prefix). A missing bucket is an error, not False."""
        bucket, key = parse_s3_uri(uri)
        return self.backend(bucket).head(key) is not None

    def list(self, uri_prefix: str) -> builtins.list[StoredObject]:
        """The objects under a prefix (a directory of keys), in key order."""
        bucket, key = parse_s3_uri(uri_prefix)
        return builtins.list(self.backend(bucket).objects_under(key))

    def download_prefix(self, uri: str, dest_dir: Path, shard: tuple[int, int] | None = None) -> int:
        """Copy every object under ``uri`` into ``dest_dir``, keeping paths relative to the prefix; if
        ``uri`` names one object, copy just it, as ``dest_dir/<its name>``. ``shard=(i, n)`` keeps every
        n-th object from the i-th, in key order (SageMaker's ShardedByS3Key). Returns the number copied."""
        selected = self._objects_for(uri)
        if shard is not None:
            index, count = shard
            selected = selected[index::count]
        for item, relative in selected:
            self.backend(item.bucket).get(item.key, _local_path(Path(dest_dir), relative, item.uri))
        return len(selected)

    def sync_dir_from(self, uri_prefix: str, dest_dir: Path) -> int:
        """Copy the objects under the prefix that ``dest_dir`` lacks or holds an older copy of (by
        modification time), so that newer local files are never overwritten. Returns the number copied.
        A default-root bucket that nothing has been written to yet holds nothing (a first start's
        checkpoints); any other missing bucket is an error."""
        bucket, _ = parse_s3_uri(uri_prefix)
        if self._created_on_write(bucket) and not self.backend(bucket).bucket_exists():
            return 0
        copied = 0
        for item, relative in self._objects_for(uri_prefix):
            local = _local_path(Path(dest_dir), relative, item.uri)
            with contextlib.suppress(FileNotFoundError):
                if local.stat().st_mtime_ns >= item.mtime_ns:
                    continue
            self.backend(item.bucket).get(item.key, local)
            copied += 1
        return copied

    def _objects_for(self, uri: str) -> builtins.list[tuple[StoredObject, str]]:
        """The object the URI names, or else those under it as a prefix, each with its relative path."""
        bucket, key = parse_s3_uri(uri)
        backend = self.backend(bucket)
        single = backend.head(key)
        if single is not None:
            return [(single, key.rsplit("/", 1)[-1])]
        prefix = key.rstrip("/")
        return [(item, item.key[len(prefix) :].lstrip("/")) for item in backend.objects_under(prefix)]

    def download_file(self, uri: str, dest: Path) -> None:
        """Copy the object ``uri`` to the file ``dest``."""
        bucket, key = parse_s3_uri(uri)
        self.backend(bucket).get(key, Path(dest))

    def upload_file(self, path: Path, uri: str) -> None:
        """Store one local file as the object ``uri``."""
        bucket, key = parse_s3_uri(uri)
        if not key or key.endswith("/"):
            raise StorageError(uri, "an object needs a key that does not end with '/'")
        self._put(bucket, Path(path), key, uri)

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
        bucket, prefix = parse_s3_uri(uri_prefix)
        backend = self.backend(bucket)
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
            if not _resolves_inside(path, Path(src_dir)):
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

    def _put(self, bucket: str, path: Path, key: str, uri: str) -> None:
        if path.is_symlink():
            raise StorageError(uri, f"cannot upload {path}: a symbolic link, not followed")
        if not path.is_file():
            raise StorageError(uri, f"cannot upload {path}: not a file")
        self.backend(bucket).put(path, key)


def _as_bucket(where: Bucket | str | os.PathLike[str]) -> Bucket:
    if isinstance(where, (DirectoryBucket, S3Bucket)):
        return where
    return DirectoryBucket(os.fspath(where))
