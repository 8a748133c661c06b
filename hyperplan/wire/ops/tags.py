"""SageMaker's AddTags, ListTags and DeleteTags, for training plans, clusters and training jobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hyperplan.core.paging import paginate
from hyperplan.services.plans import tags
from hyperplan.services.plans.tags import Tag
from hyperplan.wire.operations import RequestContext, operation


def tags_of(request: dict[str, Any]) -> list[Tag]:
    """A request's `Tags` (the model checked each key's and value's length and characters)."""
    return [Tag(t["Key"], t.get("Value", "")) for t in request.get("Tags", [])]


def wire_tags(found: list[Tag]) -> list[dict[str, str]]:
    return [{"Key": t.key, "Value": t.value} for t in found]


def created(ctx: RequestContext, request: dict[str, Any], create: Callable[[], str]) -> str:
    """A create with `Tags`: the tags are checked first, the resource made, then tagged."""
    given = tags_of(request)
    tags.check(given)
    arn = create()
    tags.tag_new(ctx.runtime, ctx.caller.account_id, arn, given)
    return arn


@operation("AddTags")
def add_tags(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    found = tags.add(ctx.runtime, ctx.caller, request["ResourceArn"], tags_of(request))
    return {"Tags": wire_tags(found)}


@operation("DeleteTags")
def delete_tags(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    tags.remove(ctx.runtime, ctx.caller, request["ResourceArn"], request["TagKeys"])
    return {}


@operation("ListTags")
def list_tags(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    found = wire_tags(tags.list_tags(ctx.runtime, ctx.caller, request["ResourceArn"]))
    page, token = paginate(
        found, request.get("MaxResults", 50), request.get("NextToken"), f"ListTags {request['ResourceArn']}"
    )
    return {"Tags": page, **({"NextToken": token} if token else {})}
