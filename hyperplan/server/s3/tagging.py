"""Object tagging: GetObjectTagging, PutObjectTagging and DeleteObjectTagging, under S3's limits on a
tag set.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from hyperplan.core.bucket_rights import Right
from hyperplan.errors import InvalidTag, MalformedXML
from hyperplan.objects import served as files
from hyperplan.server.s3.answers import element, xml_answer
from hyperplan.server.s3.call import Call
from hyperplan.server.s3.object_files import existing_object, storage_failure
from hyperplan.wire import s3_model

MAX_TAGS = 10
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256


async def get_object_tagging(call: Call) -> Response:
    served, _info = await existing_object(call)
    tag_set = await run_in_threadpool(files.tags, served.root, call.key)
    inner = "".join(f"<Tag>{element('Key', k)}{element('Value', v)}</Tag>" for k, v in tag_set.items())
    return xml_answer("Tagging", f"<TagSet>{inner}</TagSet>")


def _tag_set(document: dict[str, Any]) -> dict[str, str]:
    tag_set: dict[str, str] = {}
    for tag in document.get("TagSet", []):
        key, value = tag["Key"], tag["Value"]
        if key in tag_set:
            raise InvalidTag(f"Cannot provide multiple Tags with the same key: {key[:200]!r}.")
        if len(key) > MAX_TAG_KEY or len(value) > MAX_TAG_VALUE:
            raise InvalidTag(
                f"A tag's key is at most {MAX_TAG_KEY} characters, its value at most {MAX_TAG_VALUE}: "
                f"{key[:200]!r}."
            )
        tag_set[key] = value
    if len(tag_set) > MAX_TAGS:
        raise InvalidTag(f"Object tags cannot be greater than {MAX_TAGS}; got {len(tag_set)}.")
    return tag_set


async def put_object_tagging(call: Call) -> Response:
    # Read rights first: a key of a bucket one cannot see is not named.
    served, _info = await existing_object(call)
    await call.bucket_for(Right.WRITE)
    document = await call.checked_xml_body()
    if document is None:
        raise MalformedXML(f"{s3_model.MALFORMED}: PutObjectTagging takes a <Tagging> document.")
    tag_set = _tag_set(document)
    try:
        await run_in_threadpool(files.set_tags, served.root, call.key, tag_set)
    except (files.ServedError, OSError) as error:
        raise storage_failure(error) from None
    return Response(b"")


async def delete_object_tagging(call: Call) -> Response:
    served, _info = await existing_object(call)
    await call.bucket_for(Right.WRITE)
    try:
        await run_in_threadpool(files.set_tags, served.root, call.key, {})
    except (files.ServedError, OSError) as error:
        raise storage_failure(error) from None
    return Response(b"", status_code=204)
