"""Native routes for buckets: create one, list those you may use, and (administrators) grant and revoke.

docs/API.md documents the routes. Handlers translate; the rules live in
hyperplan.services.storage.bucket_rights and hyperplan.core.bucket_rights.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.storage import bucket_rights
from hyperplan.services.storage.bucket_rights import BucketView

MAX_BUCKET_NAME = 63
MAX_ACCOUNT_REF = 64


def _bucket_json(view: BucketView) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "Name": view.name,
        "Kind": view.kind,
        "Owners": [{"AccountId": i, "AccountName": name} for i, name in view.owners],
        "OwnedByAdministrators": not view.owners,
        "Grants": [
            {"Account": g.grantee, "AccountName": g.account_name, "Access": g.access} for g in view.grants
        ],
        "Access": view.access,
    }
    if view.location:
        answer["Location"] = view.location
    return answer


def list_buckets(request: NativeRequest) -> dict[str, Any]:
    found = bucket_rights.list_buckets(request.runtime, request.caller)
    return {"Buckets": [_bucket_json(view) for view in found]}


def create_bucket(request: NativeRequest) -> dict[str, Any]:
    name = fields.required_text(request.body, "Name", max_length=MAX_BUCKET_NAME)
    return _bucket_json(bucket_rights.create_bucket(request.runtime, request.caller, name))


def grant(request: NativeRequest) -> dict[str, Any]:
    account = fields.required_text(request.body, "Account", max_length=MAX_ACCOUNT_REF)
    read_only = bool(fields.boolean(request.body, "ReadOnly"))
    view = bucket_rights.grant(
        request.runtime, _bucket(request), account, read_only=read_only, caller=request.caller
    )
    return _bucket_json(view)


def revoke(request: NativeRequest) -> dict[str, Any]:
    account = fields.required_text(request.path, "account", max_length=MAX_ACCOUNT_REF)
    return _bucket_json(bucket_rights.revoke(request.runtime, _bucket(request), account, request.caller))


def _bucket(request: NativeRequest) -> str:
    return fields.required_text(request.path, "bucket", max_length=MAX_BUCKET_NAME)


def routes() -> list[Route]:
    return [
        NativeRoute("GET", "/api/v1/buckets", list_buckets),
        NativeRoute("POST", "/api/v1/buckets", create_bucket, body=("Name",)),
        NativeRoute(
            "POST", "/api/v1/buckets/{bucket}/grants", grant, admin=True, body=("Account", "ReadOnly")
        ),
        NativeRoute("DELETE", "/api/v1/buckets/{bucket}/grants/{account}", revoke, admin=True),
    ]
