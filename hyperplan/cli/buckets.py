"""`hyperplan buckets`: who owns each bucket, and the rights administrators grant on them."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Buckets: owners, grants, and new empty buckets.", no_args_is_help=True)

BucketArg = Annotated[str, typer.Argument(help="The bucket's name, as in s3://BUCKET/...")]
AccountArg = Annotated[
    str, typer.Argument(help='An account\'s name or id, or "*" for every account (read-only).')
]


@app.command("list")
def list_buckets() -> None:
    """The buckets you may use (administrators: all), with their owners and grants."""
    from hyperplan.cli.views.buckets import BucketsTable

    with reporting_errors():
        result = native_client().get("/api/v1/buckets")
    emit(result["Buckets"], BucketsTable)


@app.command("create")
def create(name: BucketArg) -> None:
    """Create an empty directory bucket that your account owns."""
    from hyperplan.cli.views.buckets import BucketChanged

    with reporting_errors():
        bucket = native_client().post("/api/v1/buckets", {"Name": name})
    emit(bucket, lambda b: BucketChanged(b, "created"))


@app.command("grant")
def grant(
    bucket: BucketArg,
    account: AccountArg,
    read_only: Annotated[bool, typer.Option("--read-only", help="Read, but not write.")] = False,
) -> None:
    """Let an account read and write a bucket, or only read it (administrators)."""
    from hyperplan.cli.views.buckets import BucketChanged

    with reporting_errors():
        result = native_client().post(
            f"/api/v1/buckets/{quote(bucket, safe='')}/grants", {"Account": account, "ReadOnly": read_only}
        )
    emit(result, lambda b: BucketChanged(b, "granted"))


@app.command("revoke")
def revoke(bucket: BucketArg, account: AccountArg) -> None:
    """Take back an account's grant on a bucket (administrators): its later transfers are refused."""
    from hyperplan.cli.views.buckets import BucketChanged

    with reporting_errors():
        result = native_client().delete(
            f"/api/v1/buckets/{quote(bucket, safe='')}/grants/{quote(account, safe='')}"
        )
    emit(result, lambda b: BucketChanged(b, "revoked"))
