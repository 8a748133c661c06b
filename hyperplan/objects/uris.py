"""``s3://BUCKET/KEY`` URIs: their rules, the objects they name, and the one error of the objects layer."""

from __future__ import annotations

from dataclasses import dataclass

from hyperplan.core.buckets import bucket_name_problem, key_problem

SCHEME = "s3://"
TEMP_PREFIX = ".hyperplan-tmp-"
"""Names of files being written; never listed, so a half-written object is never seen."""


class StorageError(Exception):
    """A storage operation failed; ``uri`` names the object or prefix, and the message starts with it."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"{uri}: {reason}")
        self.uri = uri
        self.reason = reason


class BucketAccessError(StorageError):
    """The account a transfer is made for may not use the bucket (hyperplan/core/bucket_rights.py);
    ``message`` is the whole refusal, starting with the URI, as CreateTrainingJob would have said it."""

    def __init__(self, uri: str, message: str) -> None:
        Exception.__init__(self, message)
        self.uri = uri
        self.reason = message.removeprefix(f"{uri}: ")


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
