"""An object as the handlers reach it: its key checked before it is written, its metadata from the
``x-amz-meta-*`` headers, a body received into a staged file, an existing object (or NoSuchKey), the
source of a copy, and a storage failure turned into S3's error. Shared by objects.py, multipart.py and
tagging.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

from starlette.concurrency import run_in_threadpool

from hyperplan.core.bucket_rights import Right
from hyperplan.core.buckets import key_problem
from hyperplan.errors import HyperplanError, InvalidArgument, InvalidS3Request, NoSuchKey
from hyperplan.objects import served as files
from hyperplan.server.limits import MIB
from hyperplan.server.s3.body import Received
from hyperplan.server.s3.call import Call
from hyperplan.services.storage.bucket_rights import ServedBucket

MAX_KEY_BYTES = 1024


def check_key(key: str) -> None:
    """Refuse a key no object may be written under: one the bucket's directory cannot hold
    (core/buckets.py), a folder marker, or one longer than S3 allows."""
    problem = key_problem(key)
    if problem is None and key.endswith("/"):
        problem = "a key ending in '/' (a folder marker) cannot be kept in a directory bucket"
    if problem is None and len(key.encode("utf-8", "surrogateescape")) > MAX_KEY_BYTES:
        problem = f"a key may be at most {MAX_KEY_BYTES} bytes long"
    if problem is not None:
        raise InvalidArgument(f"Object key {key[:200]!r}: {problem}.")


def user_metadata(headers: dict[str, str]) -> dict[str, str]:
    """The ``x-amz-meta-*`` headers without their prefix: the metadata kept with an object."""
    return {
        name.removeprefix("x-amz-meta-"): value
        for name, value in headers.items()
        if name.startswith("x-amz-meta-")
    }


def storage_failure(error: Exception) -> HyperplanError:
    """A failure to store an object as S3's error: served.py's refusal, or the file system's reason.
    Anything else is a bug, raised as it is."""
    if isinstance(error, files.ServedError):
        return InvalidS3Request(str(error))
    if isinstance(error, OSError):
        return InvalidS3Request(f"The object could not be stored: {files.reason(error)}.")
    raise error


async def receive_object(call: Call, staged: tuple[int, Path]) -> tuple[Path, Received]:
    """The body received into a staged file (``staged``: its open descriptor and path); the file is
    removed if the body fails, so nothing half-received is left behind."""
    handle, path = staged
    try:
        with os.fdopen(handle, "wb", buffering=MIB) as sink:
            received = await call.body_into(sink)
    except BaseException:
        files.discard(path)
        raise
    return path, received


async def existing_object(call: Call) -> tuple[ServedBucket, files.ObjectInfo]:
    """The object the call names, once the caller's read right on its bucket is checked: (its bucket,
    its head), or NoSuchKey, also for a key no object could have."""
    served = await call.bucket_for(Right.READ)
    problem = key_problem(call.key)
    info = None
    if problem is None:
        try:
            info = await run_in_threadpool(files.head, served.root, call.key)
        except files.ServedError:
            info = None
    if info is None:
        raise NoSuchKey(f"The specified key does not exist: {call.key[:200]!r}.")
    return served, info


def _copy_source(text: str) -> tuple[str, str]:
    source = unquote(text.split("?", 1)[0]).lstrip("/")
    bucket, _, key = source.partition("/")
    if not bucket or not key:
        raise InvalidArgument(f"x-amz-copy-source {text[:200]!r} must name BUCKET/KEY.")
    return bucket, key


async def copy_source_object(call: Call) -> tuple[ServedBucket, str, files.ObjectInfo]:
    """The object ``x-amz-copy-source`` names, once the caller's read right on its bucket is checked:
    (its bucket, its key, its head), or NoSuchKey."""
    source_bucket, source_key = _copy_source(call.header("x-amz-copy-source") or "")
    source = await call.bucket_for(Right.READ, source_bucket)
    info = (
        await run_in_threadpool(files.head, source.root, source_key)
        if key_problem(source_key) is None
        else None
    )
    if info is None:
        raise NoSuchKey(f"The specified key does not exist: {source_key[:200]!r}.")
    return source, source_key, info
