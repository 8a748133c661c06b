"""Native routes for an account's users and their access keys: self-service, no administrator needed.

docs/API.md documents the routes. Handlers translate; who may do what, and the rules, live in
hyperplan.services.orchestration.user_views and hyperplan.services.accounts.users.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.errors import ValidationError
from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute, new_key_json
from hyperplan.services.orchestration import user_views
from hyperplan.services.orchestration.user_views import AccessKeyView, UserView

MAX_USER_NAME = 64
MAX_ACCOUNT_REF = 64
MAX_KEY_ID = 128


def _user_json(user: UserView) -> dict[str, Any]:
    return {
        "AccountId": user.account_id,
        "AccountName": user.account_name,
        "UserName": user.name,
        "Owner": user.is_owner,
        "CreatedAt": user.created_at,
        "ActiveKeys": user.active_keys,
        "InactiveKeys": user.inactive_keys,
    }


def _key_json(key: AccessKeyView) -> dict[str, Any]:
    return {
        "AccessKeyId": key.access_key_id,
        "AccountId": key.account_id,
        "AccountName": key.account_name,
        "UserName": key.user_name,
        "Status": key.status,
        "CreatedAt": key.created_at,
    }


def _account(request: NativeRequest, *, in_body: bool = False) -> str | None:
    if in_body:
        return fields.text(request.body, "Account", required=False, max_length=MAX_ACCOUNT_REF)
    return fields.query_text(request.query, "account", max_length=MAX_ACCOUNT_REF)


def _key_id(request: NativeRequest) -> str:
    key_id = request.path["key"]
    if len(key_id) > MAX_KEY_ID:
        raise ValidationError(f"An access key id is at most {MAX_KEY_ID} characters, not {len(key_id)}.")
    return key_id


# -- users -----------------------------------------------------------------------------------------------


def list_users(request: NativeRequest) -> dict[str, Any]:
    found = user_views.list_users(request.runtime, request.caller, _account(request))
    return {"Users": [_user_json(user) for user in found]}


def create_user(request: NativeRequest) -> dict[str, Any]:
    body = request.body
    created = user_views.create_user(
        request.runtime,
        request.caller,
        fields.required_text(body, "UserName", max_length=MAX_USER_NAME),
        owner=bool(fields.boolean(body, "Owner")),
        account_ref=_account(request, in_body=True),
    )
    return {"User": _user_json(created.user), "AccessKey": new_key_json(created.key)}


def delete_user(request: NativeRequest) -> dict[str, Any]:
    user = user_views.delete_user(request.runtime, request.caller, request.path["user"], _account(request))
    return {**_user_json(user), "Deleted": True}


# -- keys ------------------------------------------------------------------------------------------------


def list_keys(request: NativeRequest) -> dict[str, Any]:
    user = fields.query_text(request.query, "user", max_length=MAX_USER_NAME)
    found = user_views.list_keys(request.runtime, request.caller, user, _account(request))
    return {"AccessKeys": [_key_json(key) for key in found]}


def create_key(request: NativeRequest) -> dict[str, Any]:
    user = fields.text(request.body, "UserName", required=False, max_length=MAX_USER_NAME)
    key = user_views.create_key(request.runtime, request.caller, user, _account(request, in_body=True))
    return new_key_json(key)


def activate_key(request: NativeRequest) -> dict[str, Any]:
    return _key_json(
        user_views.set_key_status(request.runtime, request.caller, _key_id(request), active=True)
    )


def deactivate_key(request: NativeRequest) -> dict[str, Any]:
    return _key_json(
        user_views.set_key_status(request.runtime, request.caller, _key_id(request), active=False)
    )


def delete_key(request: NativeRequest) -> dict[str, Any]:
    key = user_views.delete_key(request.runtime, request.caller, _key_id(request))
    return {**_key_json(key), "Deleted": True}


def routes() -> list[Route]:
    return [
        NativeRoute("GET", "/api/v1/users", list_users, query=("account",)),
        NativeRoute("POST", "/api/v1/users", create_user, body=("UserName", "Owner", "Account")),
        NativeRoute("DELETE", "/api/v1/users/{user}", delete_user, query=("account",)),
        NativeRoute("GET", "/api/v1/keys", list_keys, query=("user", "account")),
        NativeRoute("POST", "/api/v1/keys", create_key, body=("UserName", "Account")),
        NativeRoute("POST", "/api/v1/keys/{key}/activate", activate_key),
        NativeRoute("POST", "/api/v1/keys/{key}/deactivate", deactivate_key),
        NativeRoute("DELETE", "/api/v1/keys/{key}", delete_key),
    ]
