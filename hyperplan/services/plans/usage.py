"""Usage per account: instance-hours reserved by plans against instance-hours used by nodes and jobs,
in service time, per account, pool and UTC day (docs/OPERATIONS.md). It tells a platform team which
teams leave their reservations idle.

Reserved: each segment that holds capacity (not one whose plan failed before it began), from its start
to its end, or to the moment a cancellation released it. Used: each cluster node from its launch until
it ended (or now), one instance; each training job while it was Downloading or Training (its
transitions), times its instance count. Both are cut at UTC midnights and at the asked window.
Grouped by a tag key, each row also carries the value that tag has on the plan, the cluster or the job
("" when it has none).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.jobs import RUNNING
from hyperplan.errors import AccessDenied, ValidationError
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import (
    Account,
    Cluster,
    ClusterNode,
    EndedNodeUsage,
    InstanceGroup,
    ReservedCapacity,
    ResourceTag,
    TrainingJob,
    TrainingJobTransition,
    TrainingPlan,
)

MAX_DAYS = 400
DEFAULT_DAYS = 30


@dataclass(frozen=True)
class UsageRow:
    account: str
    instance_type: str
    zone: str
    day: date
    reserved_instance_hours: float
    used_instance_hours: float
    tag_value: str | None = None  # grouped by a tag: its value ("" untagged)


Key = tuple[str, str, str, date, str | None]


def usage(
    runtime: ServiceContext,
    caller: Caller,
    *,
    account_ref: str | None,
    start: datetime | None,
    end: datetime | None,
    tag_key: str | None = None,
) -> list[UsageRow]:
    now = runtime.clock.now()
    end = end or now
    start = start or _midnight(end) - timedelta(days=DEFAULT_DAYS)
    if end <= start:
        raise ValidationError(f"from ({start.isoformat()}) must be before to ({end.isoformat()}).")
    if end - start > timedelta(days=MAX_DAYS):
        raise ValidationError(f"A usage report covers at most {MAX_DAYS} days; ask for a shorter window.")
    reserved: dict[Key, float] = defaultdict(float)
    used: dict[Key, float] = defaultdict(float)
    with runtime.db.read() as session:
        account_id = _scope(session, caller, account_ref)
        names = {a.id: a.name for a in session.scalars(select(Account))}
        tags = _tag_values(session, tag_key) if tag_key else {}

        def add(into: dict[Key, float], arn: str, account: str, pool: tuple[str, str], a: datetime,
                b: datetime, count: int) -> None:  # fmt: skip
            tag = tags.get(arn, "") if tag_key else None
            for day, hours in _days(max(a, start), min(b, end)):
                into[(names.get(account, account), pool[0], pool[1], day, tag)] += hours * count

        plans = select(ReservedCapacity, TrainingPlan).join(
            TrainingPlan, TrainingPlan.id == ReservedCapacity.plan_id
        )
        if account_id:
            plans = plans.where(TrainingPlan.account_id == account_id)
        for segment, plan in session.execute(plans.where(ReservedCapacity.holds_capacity.is_(True))):
            until = min(segment.end, segment.released_at) if segment.released_at else segment.end
            arn = runtime.arn(plan.account_id, f"training-plan/{plan.name}")
            pool = (segment.instance_type, segment.availability_zone)
            add(reserved, arn, plan.account_id, pool, segment.start, until, segment.count)
        nodes = (
            select(ClusterNode, InstanceGroup, Cluster)
            .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
            .join(Cluster, Cluster.id == ClusterNode.cluster_id)
        )
        if account_id:
            nodes = nodes.where(Cluster.account_id == account_id)
        for node, group, cluster in session.execute(nodes):
            arn = runtime.arn(cluster.account_id, f"cluster/{cluster.cluster_id}")
            pool = (group.instance_type, node.availability_zone)
            add(used, arn, cluster.account_id, pool, node.launched_at, node.ended_at or now, 1)
        ended = select(EndedNodeUsage)
        if account_id:
            ended = ended.where(EndedNodeUsage.account_id == account_id)
        for record in session.scalars(ended.where(EndedNodeUsage.ended_at > start)):
            arn = runtime.arn(record.account_id, f"cluster/{record.cluster_id}")
            pool = (record.instance_type, record.availability_zone)
            add(used, arn, record.account_id, pool, record.launched_at, record.ended_at, 1)
        jobs = (
            select(TrainingJobTransition, TrainingJob)
            .join(TrainingJob, TrainingJob.id == TrainingJobTransition.job_id)
            .where(TrainingJobTransition.status.in_([s.value for s in RUNNING]))
        )
        if account_id:
            jobs = jobs.where(TrainingJob.account_id == account_id)
        for transition, job in session.execute(jobs):
            arn = runtime.arn(job.account_id, f"training-job/{job.name}")
            pool = (job.instance_type, job.availability_zone or "")
            add(
                used,
                arn,
                job.account_id,
                pool,
                transition.started_at,
                transition.ended_at or now,
                job.instance_count,
            )
    keys = sorted(set(reserved) | set(used), key=lambda k: (k[0], k[4] or "", k[1], k[2], k[3]))
    return [
        UsageRow(k[0], k[1], k[2], k[3], round(reserved.get(k, 0.0), 4), round(used.get(k, 0.0), 4), k[4])
        for k in keys
    ]


def _scope(session: Session, caller: Caller, account_ref: str | None) -> str | None:
    """Administrators: every account, or the one named. Others: their own."""
    if not caller.is_admin:
        if account_ref and account_ref not in (caller.account_id, caller.account_name):
            raise AccessDenied(
                f"Only administrators read other accounts' usage; {caller.account_name!r} is not one."
            )
        return caller.account_id
    return accounts.get_account(session, account_ref).id if account_ref else None


def _tag_values(session: Session, key: str) -> dict[str, str]:
    rows = session.execute(select(ResourceTag.resource_arn, ResourceTag.value).where(ResourceTag.key == key))
    return {arn: value for arn, value in rows}


def _midnight(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _days(a: datetime, b: datetime) -> Iterator[tuple[date, float]]:
    """The hours of [a, b) in each UTC day it touches."""
    while a < b:
        next_day = _midnight(a) + timedelta(days=1)
        cut = min(b, next_day)
        yield a.astimezone(UTC).date(), (cut - a).total_seconds() / 3600
        a = cut
