"""The object operations: PutObject, GetObject and HeadObject (whole or a single byte range),
DeleteObject, DeleteObjects and CopyObject.
"""

from __future__ import annotations

import os

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from hyperplan.core.bucket_rights import Right
from hyperplan.core.buckets import key_problem
from hyperplan.errors import InvalidRange, MalformedXML, NoSuchKey
from hyperplan.objects import served as files
from hyperplan.server.s3.answers import (
    FileAnswer,
    checksum_headers,
    element,
    iso_time,
    object_headers,
    xml_answer,
)
from hyperplan.server.s3.call import Call
from hyperplan.server.s3.object_files import (
    check_key,
    copy_source_object,
    existing_object,
    receive_object,
    storage_failure,
    user_metadata,
)
from hyperplan.wire import s3_model

MAX_DELETES = 1000


async def put_object(call: Call) -> Response:
    check_key(call.key)
    served = await call.bucket_for(Right.WRITE)
    staged = await run_in_threadpool(files.staged_file, served.root)
    path, received = await receive_object(call, staged)
    content_type = call.header("content-type")
    metadata = user_metadata(call.request.headers)
    try:
        info = await run_in_threadpool(
            files.commit, path, served.root, call.key, f'"{received.md5_hex}"', content_type, metadata
        )
    except (files.ServedError, OSError) as error:
        raise storage_failure(error) from None
    return Response(b"", headers={"ETag": info.etag, **checksum_headers(received)})


def _parse_range(text: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single ``bytes=`` range, None for the whole object (also for a range
    header S3 would ignore); InvalidRange when it cannot be satisfied."""
    if text is None or not text.startswith("bytes=") or "," in text:
        return None
    first, dash, last = text.removeprefix("bytes=").strip().partition("-")
    if (
        not dash
        or not (first.isdigit() or last.isdigit())
        or (first and not first.isdigit())
        or (last and not last.isdigit())
    ):
        return None
    if not first:
        length = int(last)
        if length == 0 or size == 0:
            raise InvalidRange(f"The requested range is not satisfiable: {text} of {size} bytes.")
        return max(size - length, 0), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if last and int(last) < start:
        return None
    if start >= size:
        raise InvalidRange(f"The requested range is not satisfiable: {text} of {size} bytes.")
    return start, end


async def head_object(call: Call) -> Response:
    _served, info = await existing_object(call)
    headers = object_headers(info)
    span = _parse_range(call.header("range"), info.size)
    status, length = 200, info.size
    if span is not None:
        status, length = 206, span[1] - span[0] + 1
        headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{info.size}"
    headers["Content-Length"] = str(length)
    return Response(None, status_code=status, headers=headers)


async def get_object(call: Call) -> Response:
    served, info = await existing_object(call)
    try:
        handle = await run_in_threadpool(files.object_path(served.root, call.key).open, "rb")
    except (FileNotFoundError, NotADirectoryError):
        raise NoSuchKey(f"The specified key does not exist: {call.key[:200]!r}.") from None
    size = os.fstat(handle.fileno()).st_size
    headers = object_headers(info)
    try:
        span = _parse_range(call.header("range"), size)
    except InvalidRange:
        handle.close()
        raise
    start, length, status = 0, size, 200
    if span is not None:
        start, length, status = span[0], span[1] - span[0] + 1, 206
        headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{size}"
    headers["Content-Length"] = str(length)
    for name in ("content-type", "content-disposition", "cache-control", "content-encoding"):
        override = call.request.query.get(f"response-{name}")
        if override is not None:
            headers[name.title()] = override
    answer = FileAnswer(handle, start, length, status, headers)
    return answer  # type: ignore[return-value]  # an ASGI answer like a Response


async def delete_object(call: Call) -> Response:
    served = await call.bucket_for(Right.WRITE)
    if key_problem(call.key) is None:
        await run_in_threadpool(files.delete, served.root, call.key)
    return Response(b"", status_code=204)


async def delete_objects(call: Call) -> Response:
    document = await call.checked_xml_body()
    if document is None:
        raise MalformedXML(
            f"{s3_model.MALFORMED}: DeleteObjects takes a <Delete> document naming the objects."
        )
    objects = document.get("Objects", [])
    if not objects or len(objects) > MAX_DELETES:
        raise MalformedXML(f"{s3_model.MALFORMED}: DeleteObjects names 1 to {MAX_DELETES} objects.")
    quiet = bool(document.get("Quiet"))
    served = await call.bucket_for(Right.WRITE)
    deleted, failed = [], []
    for item in objects:
        key = item["Key"]
        problem = key_problem(key)
        if problem is not None:
            failed.append(
                f"<Error>{element('Key', key)}{element('Code', 'InvalidArgument')}"
                f"{element('Message', problem)}</Error>"
            )
            continue
        await run_in_threadpool(files.delete, served.root, key)
        if not quiet:
            deleted.append(f"<Deleted>{element('Key', key)}</Deleted>")
    return xml_answer("DeleteResult", "".join(deleted) + "".join(failed))


async def copy_object(call: Call) -> Response:
    check_key(call.key)
    source, source_key, info = await copy_source_object(call)
    served = await call.bucket_for(Right.WRITE)
    replace = (call.header("x-amz-metadata-directive") or "COPY").upper() == "REPLACE"
    content_type = call.header("content-type") if replace else info.content_type
    metadata = user_metadata(call.request.headers) if replace else dict(info.metadata)
    try:
        staged, md5_hex = await run_in_threadpool(
            files.copy_into_staged, files.object_path(source.root, source_key), served.root
        )
        copied = await run_in_threadpool(
            files.commit, staged, served.root, call.key, f'"{md5_hex}"', content_type, metadata
        )
    except FileNotFoundError:
        raise NoSuchKey(f"The specified key does not exist: {source_key[:200]!r}.") from None
    except (files.ServedError, OSError) as error:
        raise storage_failure(error) from None
    inner = element("LastModified", iso_time(copied.mtime_ns)) + element("ETag", copied.etag)
    return xml_answer("CopyObjectResult", inner)
