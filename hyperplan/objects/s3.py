"""A bucket on an S3-compatible endpoint, through boto3 (the fleet file's ``[buckets.NAME]`` tables)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from hyperplan.core.fleet import S3Bucket
from hyperplan.objects.directory import atomic_write, os_reason
from hyperplan.objects.uris import (
    SCHEME,
    StorageError,
    StoredObject,
    check_key,
)

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


class S3Store:
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
                atomic_write(dest, lambda out: _copy_stream(body, out), lambda: (mtime_ns, mtime_ns))
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
            raise StorageError(self.uri(key), os_reason(error)) from error

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
