"""Multipart uploads: CreateMultipartUpload, UploadPart, UploadPartCopy, CompleteMultipartUpload,
AbortMultipartUpload, ListParts and ListMultipartUploads. An upload belongs to the account that started
it; its parts wait in the data directory until it is completed or aborted (hyperplan/objects/served.py).
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from hyperplan.core import s3_listing
from hyperplan.core.bucket_rights import Right
from hyperplan.errors import (
    AccessDenied,
    EntityTooSmall,
    HyperplanError,
    InvalidArgument,
    InvalidPart,
    InvalidPartOrder,
    MalformedXML,
    NoSuchUpload,
)
from hyperplan.objects import served as files
from hyperplan.server.s3.answers import (
    checksum_headers,
    element,
    iso_time,
    listed_form,
    written_size,
    xml_answer,
)
from hyperplan.server.s3.call import Call, query_count
from hyperplan.server.s3.object_files import (
    check_key,
    copy_source_object,
    receive_object,
    storage_failure,
    user_metadata,
)
from hyperplan.wire import s3_model


async def create_multipart_upload(call: Call) -> Response:
    check_key(call.key)
    await call.bucket_for(Right.WRITE)
    upload = await run_in_threadpool(
        files.start_upload,
        call.runtime.data_dir,
        call.bucket,
        call.key,
        call.caller.account_id,
        call.header("content-type"),
        user_metadata(call.request.headers),
    )
    inner = element("Bucket", call.bucket) + element("Key", call.key) + element("UploadId", upload.upload_id)
    return xml_answer("InitiateMultipartUploadResult", inner)


async def _upload(call: Call) -> files.Upload:
    upload_id = call.request.query.get("uploadId", "")
    upload = await run_in_threadpool(files.find_upload, call.runtime.data_dir, upload_id)
    if upload is None or upload.bucket != call.bucket or upload.key != call.key:
        raise NoSuchUpload(
            f"The specified upload does not exist: {upload_id[:100]!r} (completed or aborted, maybe)."
        )
    if upload.account_id != call.caller.account_id and not call.caller.is_admin:
        raise AccessDenied(f"Access Denied: upload {upload_id!r} was started by another account.")
    return upload


def _part_number(call: Call) -> int:
    text = call.request.query.get("partNumber", "")
    if not text.isdigit() or not 1 <= int(text) <= files.MAX_PARTS:
        raise InvalidArgument(
            f"Part number must be an integer between 1 and {files.MAX_PARTS}, inclusive; got {text!r}."
        )
    return int(text)


async def upload_part(call: Call) -> Response:
    number = _part_number(call)
    await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    staged = await run_in_threadpool(files.staged_part, upload)
    path, received = await receive_object(call, staged)
    try:
        part = await run_in_threadpool(files.commit_part, upload, path, number, received.md5_hex)
    except FileNotFoundError:
        raise NoSuchUpload(
            "The specified upload does not exist: it was completed or aborted meanwhile."
        ) from None
    return Response(b"", headers={"ETag": part.etag, **checksum_headers(received)})


async def complete_multipart_upload(call: Call) -> Response:
    served = await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    document = await call.checked_xml_body()
    if document is None:
        raise MalformedXML(
            f"{s3_model.MALFORMED}: CompleteMultipartUpload takes a <CompleteMultipartUpload> document "
            "naming the parts."
        )
    chosen = []
    for item in document.get("Parts", []):
        number, part_etag = item.get("PartNumber"), item.get("ETag")
        if number is None or part_etag is None:
            raise MalformedXML(f"{s3_model.MALFORMED}: every <Part> names its <PartNumber> and <ETag>.")
        chosen.append((number, part_etag))
    try:
        staged, etag = await run_in_threadpool(files.assemble, upload, chosen, served.root)
    except files.PartProblem as problem:
        kinds: dict[str, type[HyperplanError]] = {
            "InvalidPart": InvalidPart,
            "InvalidPartOrder": InvalidPartOrder,
            "EntityTooSmall": EntityTooSmall,
            "MalformedXML": MalformedXML,
        }
        raise kinds[problem.kind](str(problem)) from None
    try:
        await run_in_threadpool(
            files.commit, staged, served.root, call.key, etag, upload.content_type, upload.metadata
        )
    except (files.ServedError, OSError) as error:
        raise storage_failure(error) from None
    await run_in_threadpool(files.remove_upload, upload)
    inner = element("Location", f"/{call.bucket}/{quote(call.key)}") + element("Bucket", call.bucket)
    inner += element("Key", call.key) + element("ETag", etag)
    return xml_answer("CompleteMultipartUploadResult", inner)


async def abort_multipart_upload(call: Call) -> Response:
    await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    await run_in_threadpool(files.remove_upload, upload)
    return Response(b"", status_code=204)


async def list_parts(call: Call) -> Response:
    # Bounded in bytes by its count alone: at most 1,000 parts a page (max-parts is capped), each under
    # 200 bytes of XML (a number, a date, an ETag, a size), and the key once: under 200 KB, so no cut by
    # bytes is needed (core/page_bytes.py's 1 MiB).
    await call.bucket_for(Right.READ)
    upload = await _upload(call)
    marker = query_count(call, "part-number-marker", 0, cap=files.MAX_PARTS)
    max_parts = query_count(call, "max-parts", 1000)
    found = [part for part in await run_in_threadpool(files.parts, upload) if part.number > marker]
    shown, truncated = found[:max_parts], len(found) > max_parts
    inner = element("Bucket", call.bucket) + element("Key", call.key) + element("UploadId", upload.upload_id)
    inner += element("PartNumberMarker", marker)
    if shown:
        inner += element("NextPartNumberMarker", shown[-1].number)
    inner += element("MaxParts", max_parts) + element("IsTruncated", "true" if truncated else "false")
    inner += "".join(
        f"<Part>{element('PartNumber', p.number)}{element('LastModified', iso_time(p.mtime_ns))}"
        f"{element('ETag', p.etag)}{element('Size', p.size)}</Part>"
        for p in shown
    )
    return xml_answer("ListPartsResult", inner)


async def list_multipart_uploads(call: Call) -> Response:
    """The bucket's unfinished uploads the caller started (every account's, for an administrator): what
    ``aws s3api list-multipart-uploads`` lists to abort after an interrupted upload."""
    await call.bucket_for(Right.READ)
    query = call.request.query
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    key_marker, id_marker = query.get("key-marker", ""), query.get("upload-id-marker", "")
    max_uploads = query_count(call, "max-uploads", s3_listing.MAX_KEYS)
    found = await run_in_threadpool(files.uploads_of, call.runtime.data_dir, call.bucket)
    mine = sorted(
        (u for u in found if u.account_id == call.caller.account_id or call.caller.is_admin),
        key=lambda u: (s3_listing.sort_key(u.key), u.initiated_ns, u.upload_id),
    )
    encode = query.get("encoding-type") == "url"
    shown = listed_form(encode)
    page = s3_listing.uploads_page(
        ((u.key, u.upload_id, u) for u in mine),
        prefix=prefix,
        delimiter=delimiter,
        key_marker=key_marker,
        upload_id_marker=id_marker if key_marker else "",
        max_uploads=max_uploads,
        weigh=written_size(shown),
    )
    inner = (
        element("Bucket", call.bucket)
        + element("KeyMarker", shown(key_marker))
        + element("UploadIdMarker", id_marker)
    )
    if page.truncated:
        inner += element("NextKeyMarker", shown(page.next_key_marker))
        inner += element("NextUploadIdMarker", page.next_upload_id_marker)
    inner += element("Prefix", shown(prefix))
    if delimiter:
        inner += element("Delimiter", shown(delimiter))
    inner += element("MaxUploads", max_uploads)
    inner += element("IsTruncated", "true" if page.truncated else "false")
    for key, upload_id, upload in page.uploads:
        who = element("ID", upload.account_id) + element("DisplayName", upload.account_id)
        inner += (
            "<Upload>"
            + element("Key", shown(key))
            + element("UploadId", upload_id)
            + f"<Initiator>{who}</Initiator><Owner>{who}</Owner>"
            + element("StorageClass", "STANDARD")
            + element("Initiated", iso_time(upload.initiated_ns))
            + "</Upload>"
        )
    inner += "".join(
        f"<CommonPrefixes>{element('Prefix', shown(p))}</CommonPrefixes>" for p in page.common_prefixes
    )
    if encode:
        inner += element("EncodingType", "url")
    return xml_answer("ListMultipartUploadsResult", inner)


def _copy_range(text: str | None, size: int) -> tuple[int, int]:
    """(start, length) of ``x-amz-copy-source-range: bytes=FIRST-LAST`` (the whole object without one)."""
    if text is None:
        return 0, size
    first, dash, last = text.removeprefix("bytes=").partition("-")
    if not text.startswith("bytes=") or not dash or not first.isdigit() or not last.isdigit():
        raise InvalidArgument(
            f"The x-amz-copy-source-range value must be of the form bytes=first-last where first and last "
            f"are the zero-based offsets of the first and last bytes to copy; got {text[:100]!r}."
        )
    start, end = int(first), int(last)
    if start > end or end >= size:
        raise InvalidArgument(
            f"Range specified is not valid for source object of size: {size} ({text[:100]!r})."
        )
    return start, end - start + 1


async def upload_part_copy(call: Call) -> Response:
    """A part copied from an object, whole or a range: read rights on the source bucket, as CopyObject."""
    number = _part_number(call)
    source, source_key, info = await copy_source_object(call)
    await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    start, length = _copy_range(call.header("x-amz-copy-source-range"), info.size)
    handle, staged = await run_in_threadpool(files.staged_part, upload)
    try:
        md5_hex = await run_in_threadpool(
            files.copy_range, files.object_path(source.root, source_key), start, length, handle
        )
        part = await run_in_threadpool(files.commit_part, upload, staged, number, md5_hex)
    except FileNotFoundError:
        raise NoSuchUpload(
            "The specified upload does not exist: it was completed or aborted meanwhile."
        ) from None
    except (files.ServedError, OSError) as error:
        raise storage_failure(error) from None
    finally:
        files.discard(staged)
    inner = element("ETag", part.etag) + element("LastModified", iso_time(part.mtime_ns))
    return xml_answer("CopyPartResult", inner)
