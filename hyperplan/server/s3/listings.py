"""ListObjects and ListObjectsV2: a page of a bucket's keys under a prefix, cut at a delimiter and
weighed as the answer writes them (core/s3_listing.py), in S3's XML.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from hyperplan.core import s3_listing
from hyperplan.core.bucket_rights import Right
from hyperplan.errors import InvalidArgument
from hyperplan.objects import served as files
from hyperplan.server.s3.answers import element, iso_time, listed_form, written_size, xml_answer
from hyperplan.server.s3.call import Call, query_count


async def _listing(call: Call, prefix: str) -> list[tuple[str, files.ObjectInfo]]:
    served = await call.bucket_for(Right.READ)
    return await run_in_threadpool(lambda: list(files.keys_under(served.root, prefix)))


def _max_keys(call: Call) -> int:
    return query_count(call, "max-keys", s3_listing.MAX_KEYS)


def _contents(page: s3_listing.Page[files.ObjectInfo], shown: Callable[[str], str]) -> str:
    items = "".join(
        "<Contents>"
        + element("Key", shown(key))
        + element("LastModified", iso_time(info.mtime_ns))
        + element("ETag", info.etag)
        + element("Size", info.size)
        + element("StorageClass", "STANDARD")
        + "</Contents>"
        for key, info in page.contents
    )
    return items + "".join(
        f"<CommonPrefixes>{element('Prefix', shown(p))}</CommonPrefixes>" for p in page.common_prefixes
    )


async def list_objects_v2(call: Call) -> Response:
    query = call.request.query
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    token = query.get("continuation-token")
    after = query.get("start-after", "")
    if token is not None:
        decoded = s3_listing.decode_token(token)
        if decoded is None:
            raise InvalidArgument("The continuation token provided is incorrect.")
        after = decoded
    max_keys = _max_keys(call)
    entries = await _listing(call, prefix)
    encode = query.get("encoding-type") == "url"
    shown = listed_form(encode)
    page = s3_listing.page(
        entries, prefix=prefix, delimiter=delimiter, after=after, max_keys=max_keys, weigh=written_size(shown)
    )
    inner = element("Name", call.bucket) + element("Prefix", shown(prefix))
    if delimiter:
        inner += element("Delimiter", shown(delimiter))
    inner += element("MaxKeys", max_keys)
    inner += element("KeyCount", len(page.contents) + len(page.common_prefixes))
    inner += element("IsTruncated", "true" if page.truncated else "false")
    if token is not None:
        inner += element("ContinuationToken", token)
    if page.next_token is not None:
        inner += element("NextContinuationToken", page.next_token)
    if "start-after" in query:
        inner += element("StartAfter", shown(query["start-after"]))
    if encode:
        inner += element("EncodingType", "url")
    return xml_answer("ListBucketResult", inner + _contents(page, shown))


async def list_objects(call: Call) -> Response:
    query = call.request.query
    prefix, delimiter, marker = query.get("prefix", ""), query.get("delimiter", ""), query.get("marker", "")
    max_keys = _max_keys(call)
    entries = await _listing(call, prefix)
    encode = query.get("encoding-type") == "url"
    shown = listed_form(encode)
    page = s3_listing.page(
        entries,
        prefix=prefix,
        delimiter=delimiter,
        after=marker,
        max_keys=max_keys,
        weigh=written_size(shown),
    )
    inner = element("Name", call.bucket) + element("Prefix", shown(prefix)) + element("Marker", shown(marker))
    if delimiter:
        inner += element("Delimiter", shown(delimiter))
    inner += element("MaxKeys", max_keys) + element("IsTruncated", "true" if page.truncated else "false")
    if page.truncated and delimiter and page.next_token is not None:
        inner += element("NextMarker", shown(s3_listing.decode_token(page.next_token) or ""))
    if encode:
        inner += element("EncodingType", "url")
    return xml_answer("ListBucketResult", inner + _contents(page, shown))
