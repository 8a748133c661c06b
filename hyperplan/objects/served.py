"""A directory bucket as S3's API serves it (hyperplan/server/s3): keys listed, objects staged and
committed whole, their metadata, and multipart uploads.

An object written through S3's API is received into a hidden temporary file at the bucket's root
(never listed: its name starts with TEMP_PREFIX), flushed to disk, given its metadata and renamed into
place only once its body is complete and checked; a failure removes it, so nothing is ever half-written.
Its metadata (ETag, Content-Type, ``x-amz-meta-*``) rides on the file as the extended attribute
``user.hyperplan.s3``, where the filesystem has them; an object without it (written by a job, or on a
filesystem without user attributes) gets an ETag made from its size and modification time.

A multipart upload lives in ``DATA_DIR/s3-uploads/UPLOAD_ID/``: its description (bucket, key, the
account that started it, its metadata) and one file per part. Completing it concatenates the chosen
parts into a staged file, committed as above, and removes the upload.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperplan.objects.directory import os_reason, resolves_inside
from hyperplan.objects.uris import TEMP_PREFIX

META_ATTRIBUTE = "user.hyperplan.s3"
MIN_PART_BYTES = 5 * 1024 * 1024
"""S3's smallest part but the last."""
MAX_PARTS = 10000
COPY_CHUNK = 1 << 20


class ServedError(Exception):
    """A filesystem refusal, in words for the client (the key's place is taken by a directory, ...)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime_ns: int
    etag: str  # quoted, as S3 sends it
    content_type: str = "binary/octet-stream"
    metadata: Mapping[str, str] = field(default_factory=dict)


# -- reading --------------------------------------------------------------------------------------------


def object_path(root: Path, key: str) -> Path:
    """The file of `key`; a symbolic link that leads out of the bucket is refused, not followed."""
    path = root / key
    if not resolves_inside(path, root):
        raise ServedError("a symbolic link in the bucket leads outside it; not followed")
    return path


def head(root: Path, key: str) -> ObjectInfo | None:
    if key.endswith("/"):
        return None
    path = object_path(root, key)
    try:
        stat = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not os.path.isfile(path):
        return None
    return _info(key, path, stat)


def _info(key: str, path: Path, stat: os.stat_result) -> ObjectInfo:
    meta = read_meta(path)
    etag = meta.get("etag") or _stand_in_etag(stat)
    return ObjectInfo(
        key,
        stat.st_size,
        stat.st_mtime_ns,
        etag,
        meta.get("content_type") or "binary/octet-stream",
        meta.get("metadata") or {},
    )


def _stand_in_etag(stat: os.stat_result) -> str:
    return (
        '"'
        + hashlib.md5(f"{stat.st_size}:{stat.st_mtime_ns}".encode(), usedforsecurity=False).hexdigest()
        + '"'
    )


def read_meta(path: Path) -> dict[str, Any]:
    try:
        raw = os.getxattr(path, META_ATTRIBUTE)
    except OSError:
        return {}
    with contextlib.suppress(ValueError):
        value = json.loads(raw)
        if isinstance(value, dict):
            return value
    return {}


def keys_under(root: Path, prefix: str) -> Iterator[tuple[str, ObjectInfo]]:
    """Every object whose key starts with `prefix` (any string, not only a directory), unordered."""
    if not root.is_dir():
        return
    top = root / prefix[: prefix.rfind("/") + 1] if "/" in prefix else root
    if not top.is_dir() or not resolves_inside(top, root):
        return
    for directory, subdirs, files in os.walk(top):
        if directory == str(root):
            subdirs[:] = [name for name in subdirs if not name.startswith(TEMP_PREFIX)]
        for name in files:
            if name.startswith(TEMP_PREFIX):
                continue
            path = Path(directory, name)
            key = path.relative_to(root).as_posix()
            if not key.startswith(prefix):
                continue
            with contextlib.suppress(OSError):  # deleted while we walked, or a link to nowhere
                if path.is_symlink() and not resolves_inside(path, root):
                    continue
                stat = path.stat()
                yield key, _info(key, path, stat)


def is_empty(root: Path) -> bool:
    return next(keys_under(root, ""), None) is None


# -- writing --------------------------------------------------------------------------------------------


def staged_file(root: Path) -> tuple[int, Path]:
    """A new hidden file at the bucket's root to receive an object: (descriptor, path)."""
    root.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=root)
    return handle, Path(name)


def commit(
    staged: Path,
    root: Path,
    key: str,
    etag: str,
    content_type: str | None,
    metadata: Mapping[str, str],
) -> ObjectInfo:
    """Make the staged (closed, complete) file the object `key`: flushed, described, renamed into place.
    The staged file is gone afterwards, whatever happens."""
    try:
        with open(staged, "rb+") as handle:
            os.fsync(handle.fileno())
        meta = {"etag": etag, "content_type": content_type, "metadata": dict(metadata)}
        with contextlib.suppress(OSError):  # a filesystem without user attributes: stand-in ETags
            os.setxattr(staged, META_ATTRIBUTE, json.dumps(meta).encode())
        os.chmod(staged, 0o644)
        dest = object_path(root, key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_dir():
                raise ServedError(f"the key {key!r} is a prefix of other objects (a directory here)")
            os.replace(staged, dest)
        except (NotADirectoryError, FileExistsError) as error:
            raise ServedError(
                f"part of the key {key!r} is an object, not a prefix ({error.filename})"
            ) from None
        except IsADirectoryError:
            raise ServedError(f"the key {key!r} is a prefix of other objects (a directory here)") from None
        return _info(key, dest, dest.stat())
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)


def discard(staged: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staged)


def delete(root: Path, key: str) -> None:
    """Remove the object if it is there (S3 answers alike either way), and the directories it leaves empty."""
    if key.endswith("/"):
        return
    path = object_path(root, key)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
        if path.is_file():
            path.unlink()
    parent = path.parent
    while parent != root and parent.is_relative_to(root):
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def copy_into_staged(source: Path, root: Path) -> tuple[Path, str]:
    """A staged copy of the object file `source` in the bucket `root`, and its content's MD5 (hex)."""
    handle, staged = staged_file(root)
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with source.open("rb") as src, os.fdopen(handle, "wb") as out:
            while chunk := src.read(COPY_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        discard(staged)
        raise
    return staged, digest.hexdigest()


def copy_range(source: Path, start: int, length: int, handle: int) -> str:
    """`length` bytes of the file `source` from `start` into the open descriptor `handle` (closed after),
    and their MD5 (hex): a part copied from an object (UploadPartCopy)."""
    digest = hashlib.md5(usedforsecurity=False)
    with source.open("rb") as src, os.fdopen(handle, "wb") as out:
        src.seek(start)
        remaining = length
        while remaining > 0 and (chunk := src.read(min(COPY_CHUNK, remaining))):
            digest.update(chunk)
            out.write(chunk)
            remaining -= len(chunk)
    if remaining > 0:
        raise ServedError("the source object changed while it was copied")
    return digest.hexdigest()


def tags(root: Path, key: str) -> dict[str, str]:
    return dict(read_meta(object_path(root, key)).get("tags") or {})


def set_tags(root: Path, key: str, tag_set: Mapping[str, str]) -> None:
    """Replace the object's tags (kept with its metadata in the file's extended attribute)."""
    path = object_path(root, key)
    meta = read_meta(path)
    if not meta:
        stat = path.stat()
        meta = {"etag": _stand_in_etag(stat)}  # the ETag it had stays the ETag it has
    meta["tags"] = dict(tag_set)
    try:
        os.setxattr(path, META_ATTRIBUTE, json.dumps(meta).encode())
    except OSError as error:
        raise ServedError(f"the object's tags cannot be kept here: {os_reason(error)}") from None


def reason(error: OSError) -> str:
    return os_reason(error)


# -- multipart uploads ------------------------------------------------------------------------------------

_UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")


@dataclass(frozen=True)
class Upload:
    upload_id: str
    bucket: str
    key: str
    account_id: str
    content_type: str | None
    metadata: Mapping[str, str]
    directory: Path
    initiated_ns: int = 0


@dataclass(frozen=True)
class Part:
    number: int
    size: int
    etag: str  # quoted
    mtime_ns: int


def uploads_root(data_dir: Path) -> Path:
    return Path(data_dir) / "s3-uploads"


def new_upload_id() -> str:
    """32 random URL-safe characters, never starting with '-': the aws CLI reads an argument that starts
    with one as an option (`s3api abort-multipart-upload --upload-id -x...` fails as "expected one
    argument"), and one id in 64 would."""
    while True:
        upload_id = secrets.token_urlsafe(24)
        if not upload_id.startswith("-"):
            return upload_id


def start_upload(
    data_dir: Path,
    bucket: str,
    key: str,
    account_id: str,
    content_type: str | None,
    metadata: Mapping[str, str],
) -> Upload:
    upload_id = new_upload_id()
    directory = uploads_root(data_dir) / upload_id
    directory.mkdir(parents=True, mode=0o700)
    description = {
        "bucket": bucket,
        "key": key,
        "account_id": account_id,
        "content_type": content_type,
        "metadata": dict(metadata),
    }
    (directory / "upload.json").write_text(json.dumps(description))
    return Upload(upload_id, bucket, key, account_id, content_type, metadata, directory)


def find_upload(data_dir: Path, upload_id: str) -> Upload | None:
    if not _UPLOAD_ID.fullmatch(upload_id):
        return None
    directory = uploads_root(data_dir) / upload_id
    try:
        described = directory / "upload.json"
        description = json.loads(described.read_text())
        initiated_ns = described.stat().st_mtime_ns
    except (OSError, ValueError):
        return None
    return Upload(
        upload_id,
        description["bucket"],
        description["key"],
        description["account_id"],
        description.get("content_type"),
        description.get("metadata") or {},
        directory,
        initiated_ns,
    )


def staged_part(upload: Upload) -> tuple[int, Path]:
    handle, name = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=upload.directory)
    return handle, Path(name)


def commit_part(upload: Upload, staged: Path, number: int, md5_hex: str) -> Part:
    """The staged part becomes part `number` (replacing an earlier one of that number)."""
    try:
        with contextlib.suppress(OSError):
            os.setxattr(staged, META_ATTRIBUTE, json.dumps({"etag": f'"{md5_hex}"'}).encode())
        (upload.directory / f"{number:05d}.md5").write_text(md5_hex)
        os.replace(staged, upload.directory / f"{number:05d}.part")
    finally:
        discard(staged)
    return _part(upload, number)  # type: ignore[return-value]


def _part(upload: Upload, number: int) -> Part | None:
    path = upload.directory / f"{number:05d}.part"
    try:
        stat = path.stat()
        md5_hex = (upload.directory / f"{number:05d}.md5").read_text().strip()
    except OSError:
        return None
    return Part(number, stat.st_size, f'"{md5_hex}"', stat.st_mtime_ns)


def parts(upload: Upload) -> list[Part]:
    found = []
    for entry in sorted(upload.directory.glob("*.part")):
        with contextlib.suppress(ValueError):
            part = _part(upload, int(entry.stem))
            if part is not None:
                found.append(part)
    return found


class PartProblem(Exception):
    """Why a CompleteMultipartUpload's list of parts is refused: `kind` is S3's code."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def assemble(upload: Upload, chosen: Sequence[tuple[int, str]], root: Path) -> tuple[Path, str]:
    """The chosen parts ((number, ETag) in the request's order), checked and concatenated into a staged
    file in the bucket `root`; and the multipart ETag (MD5 of the parts' MD5s, then '-' and their count)."""
    if not chosen:
        raise PartProblem("MalformedXML", "CompleteMultipartUpload names no part.")
    numbers = [number for number, _ in chosen]
    if numbers != sorted(set(numbers)):
        raise PartProblem(
            "InvalidPartOrder", "The list of parts was not in ascending order, or named a part twice."
        )
    found: list[Part] = []
    for number, etag in chosen:
        part = _part(upload, number)
        if part is None or part.etag.strip('"') != etag.strip().strip('"'):
            raise PartProblem(
                "InvalidPart",
                f"Part {number} was not uploaded, or its ETag is not {etag}: one or more of the specified "
                "parts could not be found.",
            )
        found.append(part)
    for part in found[:-1]:
        if part.size < MIN_PART_BYTES:
            raise PartProblem(
                "EntityTooSmall",
                f"Part {part.number} is {part.size} bytes: every part but the last must be at least "
                f"{MIN_PART_BYTES} bytes.",
            )
    handle, staged = staged_file(root)
    digests = hashlib.md5(usedforsecurity=False)
    try:
        with os.fdopen(handle, "wb") as out:
            for part in found:
                digests.update(bytes.fromhex(part.etag.strip('"')))
                with (upload.directory / f"{part.number:05d}.part").open("rb") as src:
                    shutil.copyfileobj(src, out, COPY_CHUNK)
    except BaseException:
        discard(staged)
        raise
    return staged, f'"{digests.hexdigest()}-{len(found)}"'


def remove_upload(upload: Upload) -> None:
    shutil.rmtree(upload.directory, ignore_errors=True)


def uploads_of(data_dir: Path, bucket: str) -> list[Upload]:
    root = uploads_root(data_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        upload = find_upload(data_dir, entry.name)
        if upload is not None and upload.bucket == bucket:
            found.append(upload)
    return found
