"""The bucket operations: ListBuckets, CreateBucket (its LocationConstraint against this endpoint's
region), HeadBucket, DeleteBucket (its unfinished uploads go with it) and GetBucketLocation.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from hyperplan.core.bucket_rights import Right
from hyperplan.errors import IllegalLocationConstraint, InvalidLocationConstraint
from hyperplan.objects import served as files
from hyperplan.server.errors import S3_XML
from hyperplan.server.s3.answers import NAMESPACE, element, iso_moment, xml_answer
from hyperplan.server.s3.call import Call
from hyperplan.services.storage import bucket_rights
from hyperplan.wire import s3_model


async def list_buckets(call: Call) -> Response:
    listed = await run_in_threadpool(bucket_rights.served_buckets, call.runtime, call.caller)
    inner = "".join(
        f"<Bucket>{element('Name', item.name)}{element('CreationDate', iso_moment(item.created))}</Bucket>"
        for item in listed
    )
    who = element("ID", call.caller.account_id) + element("DisplayName", call.caller.account_name)
    owner = f"<Owner>{who}</Owner>"
    return xml_answer("ListAllMyBucketsResult", f"<Buckets>{inner}</Buckets>{owner}")


async def create_bucket(call: Call) -> Response:
    config, problems = await call.xml_body()
    constraint = (config or {}).get("LocationConstraint")
    where = "CreateBucketConfiguration.LocationConstraint"
    unlisted = [problem for problem in problems if problem.path == where and problem.kind == "enum"]
    if constraint is not None and constraint != call.runtime.region:
        if unlisted:
            raise InvalidLocationConstraint(
                f"The specified location-constraint is not valid: {constraint!r}."
            )
        raise IllegalLocationConstraint(
            f"CreateBucket: LocationConstraint {constraint!r} is not this endpoint's region "
            f"{call.runtime.region!r}; leave it out or name {call.runtime.region!r}."
        )
    # The endpoint's own region is accepted even where the model's list of regions lacks it.
    s3_model.refuse(call.operation, [problem for problem in problems if problem not in unlisted])
    await run_in_threadpool(bucket_rights.create_served_bucket, call.runtime, call.caller, call.bucket)
    return Response(b"", headers={"Location": f"/{call.bucket}"})


async def head_bucket(call: Call) -> Response:
    await call.bucket_for(Right.READ)
    return Response(b"", headers={"x-amz-bucket-region": call.runtime.region})


async def delete_bucket(call: Call) -> Response:
    await run_in_threadpool(bucket_rights.delete_served_bucket, call.runtime, call.caller, call.bucket)
    for upload in await run_in_threadpool(files.uploads_of, call.runtime.data_dir, call.bucket):
        await run_in_threadpool(files.remove_upload, upload)  # its unfinished uploads go with it
    return Response(b"", status_code=204)


async def get_bucket_location(call: Call) -> Response:
    await call.bucket_for(Right.READ)
    region = "" if call.runtime.region == "us-east-1" else call.runtime.region
    return Response(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<LocationConstraint xmlns="{NAMESPACE}">'
        f"{escape(region)}</LocationConstraint>".encode(),
        media_type=S3_XML,
    )
