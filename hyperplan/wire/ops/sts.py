"""STS operations: GetCallerIdentity, so that ``aws sts get-caller-identity`` and boto3 learn who they are."""

from __future__ import annotations

import hashlib
from typing import Any

from hyperplan.wire.operations import RequestContext, operation


def user_id(account_id: str, user_name: str) -> str:
    """A stable unique id for the key's user, in the form of IAM's (``AIDA`` and 17 more characters);
    a key with no user (none should be) is the account itself, whose user id is its number."""
    if not user_name:
        return account_id
    digest = hashlib.sha256(f"{account_id}/{user_name}".encode()).hexdigest().upper()
    return "AIDA" + digest[:17]


@operation("GetCallerIdentity", service="sts")
def get_caller_identity(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    caller = ctx.caller
    arn = (
        f"arn:aws:iam::{caller.account_id}:user/{caller.user_name}"
        if caller.user_name
        else f"arn:aws:iam::{caller.account_id}:root"
    )
    return {"UserId": user_id(caller.account_id, caller.user_name), "Account": caller.account_id, "Arn": arn}
