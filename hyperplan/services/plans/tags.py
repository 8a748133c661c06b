"""Tags on training plans, clusters and training jobs, as SageMaker has them: AddTags, ListTags,
DeleteTags, and `Tags` at create. At most 50 a resource; keys beginning with `aws:` are AWS's own and
refused, as SageMaker does. The resource is named by its ARN and must be the caller's (an administrator
may tag any account's). Usage reports group by them (services/plans/usage.py). On a plan, the tag
`hyperplan:lending` is its lending policy (services/plans/lending.py): written or removed with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from hyperplan.errors import AccessDenied, ResourceNotFound, ValidationError
from hyperplan.services.accounts import acting
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import lending
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Cluster, ResourceTag, TrainingJob, TrainingPlan

MAX_TAGS = 50


@dataclass(frozen=True)
class Tag:
    key: str
    value: str


def check(tags: Sequence[Tag], where: str = "Tags") -> None:
    """What SageMaker refuses of a list of tags, before anything is written."""
    keys = [tag.key for tag in tags]
    if len(keys) > MAX_TAGS:
        raise ValidationError(f"{where}: at most {MAX_TAGS} tags a resource, not {len(keys)}.")
    for key in keys:
        if key.lower().startswith("aws:"):
            raise ValidationError(f"{where}: tag key {key!r} begins with 'aws:', which is reserved for AWS.")
    if len(set(keys)) != len(keys):
        raise ValidationError(f"{where}: a tag key appears more than once.")


def add(runtime: ServiceContext, caller: Caller, arn: str, tags: Sequence[Tag]) -> list[Tag]:
    check(tags)
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        account_id = _resource_account(session, runtime, caller, arn)
        plan = _plan(session, runtime, account_id, arn)
        if plan is not None:  # hyperplan:lending sets the plan's lending policy (a bad value refuses all)
            given = {tag.key: tag.value for tag in tags}
            lending.apply_tags(session, runtime, plan, given, runtime.clock.now(), caller)
        put(session, account_id, arn, tags)
        return _list(session, arn)


def tag_new(runtime: ServiceContext, account_id: str, arn: str, tags: Sequence[Tag]) -> None:
    """`Tags` given at create, written right after the resource (checked with `check` before it was)."""
    if tags:
        with runtime.db.write() as session:
            put(session, account_id, arn, tags)


def put(session: Session, account_id: str, arn: str, tags: Sequence[Tag]) -> None:
    """Set these tags on the resource (a key it has takes the new value), in the caller's transaction."""
    existing = {
        row.key: row for row in session.scalars(select(ResourceTag).where(ResourceTag.resource_arn == arn))
    }
    for tag in tags:
        row = existing.get(tag.key)
        if row is None:
            session.add(ResourceTag(resource_arn=arn, key=tag.key, value=tag.value, account_id=account_id))
            existing[tag.key] = ResourceTag()
        else:
            row.value = tag.value
    if len(existing) > MAX_TAGS:
        raise ValidationError(f"Tags: {arn} would have {len(existing)} tags; at most {MAX_TAGS} a resource.")


def remove(runtime: ServiceContext, caller: Caller, arn: str, keys: Sequence[str]) -> None:
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        account_id = _resource_account(session, runtime, caller, arn)
        plan = _plan(session, runtime, account_id, arn)
        if plan is not None:  # without hyperplan:lending the plan lends nothing
            lending.untag(session, runtime, plan, keys, runtime.clock.now(), caller)
        session.execute(delete(ResourceTag).where(ResourceTag.resource_arn == arn, ResourceTag.key.in_(keys)))


def list_tags(runtime: ServiceContext, caller: Caller, arn: str) -> list[Tag]:
    with runtime.db.read() as session:
        _resource_account(session, runtime, caller, arn)
        return _list(session, arn)


def _list(session: Session, arn: str) -> list[Tag]:
    rows = session.scalars(
        select(ResourceTag).where(ResourceTag.resource_arn == arn).order_by(ResourceTag.key)
    )
    return [Tag(row.key, row.value) for row in rows]


def _plan(session: Session, runtime: ServiceContext, account_id: str, arn: str) -> TrainingPlan | None:
    """The training plan the ARN names (None for a cluster or a job); `_resource_account` checked it."""
    prefix = runtime.arn(account_id, "training-plan/")
    if not arn.startswith(prefix):
        return None
    name = arn.removeprefix(prefix)
    return session.scalar(
        select(TrainingPlan).where(TrainingPlan.account_id == account_id, TrainingPlan.name == name)
    )


def _resource_account(session: Session, runtime: ServiceContext, caller: Caller, arn: str) -> str:
    """The account of the plan, cluster or job the ARN names; refused when it is not the caller's."""
    prefix = f"arn:aws:sagemaker:{runtime.region}:"
    account_id, _, resource = arn.removeprefix(prefix).partition(":")
    kind, _, name = resource.partition("/")
    if not arn.startswith(prefix) or not name:
        raise ValidationError(
            f"ResourceArn {arn!r} is not a SageMaker ARN of this region ({runtime.region})."
        )
    if account_id != caller.account_id and not caller.is_admin:
        raise AccessDenied(f"ResourceArn {arn!r} is another account's; only its own resources are tagged.")
    if kind == "training-plan":
        found = session.scalar(
            select(TrainingPlan.id).where(TrainingPlan.account_id == account_id, TrainingPlan.name == name)
        )
    elif kind == "cluster":
        found = session.scalar(
            select(Cluster.id).where(Cluster.account_id == account_id, Cluster.cluster_id == name)
        )
    elif kind == "training-job":
        found = session.scalar(
            select(TrainingJob.id).where(TrainingJob.account_id == account_id, TrainingJob.name == name)
        )
    else:
        raise ValidationError(
            f"ResourceArn {arn!r}: hyperplan tags training plans, clusters and training jobs."
        )
    if found is None:
        raise ResourceNotFound(f"There is no {kind.replace('-', ' ')} {arn!r}.")
    return account_id
