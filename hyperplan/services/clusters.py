"""HyperPod-style clusters: instance groups on training plans or on on-demand capacity, and their nodes.

Every change to a cluster (create, update, delete, node deletion) and every event of a plan that
backs groups (segment start, reclaim, end, failure) ends in `reconcile`: it computes how many nodes each
affected group should have now (its target for on-demand groups; its creation-order share of the open
segment for plan groups, none from the reclaim time on) and records the nodes to add or remove, in the
caller's transaction. What the execution back end must do about them runs after the commit
(`NodeActions`), so the store always knows a node before the back end acts on it. The node watcher
(`watch_nodes`) brings back-end states (OnCreate done or failed, shutdown finished) into the store.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.backends.base import (
    EXEC_OUTPUT_LIMIT,
    EXPIRATION_VARIABLE,
    AdoptReport,
    BackendError,
    ExecResult,
    NodeRef,
    NodeSpec,
)
from hyperplan.core.clusters import (
    GroupFacts,
    PlanFacts,
    allocate,
    check_binding,
    check_lifecycle_script,
    check_subnets,
)
from hyperplan.core.fleet import Pool
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.status import CLUSTER_LIFECYCLE, NODE_LIFECYCLE, ClusterStatus, NodeStatus
from hyperplan.errors import Conflict, ResourceInUse, ResourceLimitExceeded, ResourceNotFound, ValidationError
from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import StorageError, parse_s3_uri
from hyperplan.services import capacity_claims, lifecycle, on_demand, status, tenancy
from hyperplan.services.accounts import Caller
from hyperplan.services.cluster_request import ClusterSettings, ClusterSpec, ClusterUpdate, InstanceGroupSpec
from hyperplan.services.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, ReservedCapacity, TrainingPlan

LIVE = (NodeStatus.PENDING, NodeStatus.RUNNING, NodeStatus.FAILURE)  # nodes that hold a place in their group
GONE = NodeStatus.TERMINATED
SHUTDOWN_GRACE = timedelta(seconds=30)  # real time between SIGTERM and SIGKILL at reclaim or deletion


# -- actions for the back end, run after commit -------------------------------------------------------


@dataclass
class NodeActions:
    provision: list[tuple[ClusterNode, InstanceGroupSpec, str]] = field(
        default_factory=list
    )  # node, its group's specification, expiry
    terminate: list[tuple[str, str]] = field(default_factory=list)  # backend id, expiry epoch


def _run_actions(runtime: ServiceContext, actions: NodeActions) -> None:
    for backend_id, expiry in actions.terminate:
        with contextlib.suppress(BackendError):  # already gone: the watcher settles it
            runtime.backend.terminate(NodeRef(backend_id), SHUTDOWN_GRACE, env={EXPIRATION_VARIABLE: expiry})
    for node, spec, expiry in actions.provision:
        _provision(runtime, node, spec, expiry)
    if actions.provision or actions.terminate:
        runtime.wakes.nodes.notify()


def _provision(runtime: ServiceContext, node: ClusterNode, spec: InstanceGroupSpec, expiry: str) -> None:
    """Fetch the group's lifecycle scripts and hand the node to the back end; a fetch failure fails it."""
    source_uri, on_create = spec.lifecycle.source_uri, spec.lifecycle.on_create
    source = None
    try:
        owner = tenancy.cluster_run_as(runtime, node.cluster_id)  # None: the server's own user
        if source_uri:
            source = runtime.work_dir / "lifecycle" / node.backend_id  # the server's: the back end copies it
            if source.exists():
                shutil.rmtree(source)
            _storage(runtime).download_prefix(source_uri, source)
            if on_create and not (source / on_create).is_file():
                raise StorageError(f"{source_uri.rstrip('/')}/{on_create}", "no such lifecycle script")
        runtime.backend.provision(
            NodeSpec(
                node_id=node.backend_id,
                name=node.hostname,
                instance_type=spec.instance_type or "",  # a stored group always has one
                env={
                    EXPIRATION_VARIABLE: expiry,
                    "HYPERPLAN_INSTANCE_ID": node.instance_id,
                    "HYPERPLAN_INSTANCE_GROUP": spec.name,
                },
                lifecycle_source=source,
                on_create=on_create if source is not None else None,
                run_as=owner,
            )
        )
    except (StorageError, BackendError, ValueError) as exc:
        _fail_provisioning(runtime, node.id, f"Provisioning failed: {exc}")


def _storage(runtime: ServiceContext) -> Storage:
    return Storage.in_data_dir(runtime.data_dir, runtime.fleet.buckets)


def _fail_provisioning(runtime: ServiceContext, node_id: int, message: str) -> None:
    """A node the back end could not be handed fails, unless it was told to shut down meanwhile: then
    only its ending is news (NODE_LIFECYCLE), as for the watcher."""
    with runtime.db.write() as session:
        node = session.get(ClusterNode, node_id)
        if node is not None and NodeStatus(node.status) == NodeStatus.PENDING:
            move_node(session, node, NodeStatus.FAILURE, message, runtime.clock.now())


def move_node(session: Session, node: ClusterNode, new: NodeStatus, message: str, now: datetime) -> None:
    status.change(session, NODE_LIFECYCLE, node, new, now, message)
    node.message = message


# -- create, update, delete ---------------------------------------------------------------------------


def create(runtime: ServiceContext, caller: Caller, request: ClusterSpec) -> Cluster:
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        name = request.name
        if session.scalar(
            select(Cluster.id).where(Cluster.account_id == caller.account_id, Cluster.name == name)
        ):
            raise ResourceInUse(f"A cluster named {name!r} already exists in this account.")
        cluster = Cluster(
            account_id=caller.account_id,
            name=name,
            cluster_id=_new_cluster_id(session),
            status=ClusterStatus.IN_SERVICE,
            settings=request.settings.to_json(),
            created_at=now,
        )
        session.add(cluster)
        session.flush()
        groups = request.groups
        if not groups:
            raise ValidationError("InstanceGroups: a cluster needs at least one instance group.")
        _check_unique_names(groups, "InstanceGroups")
        _check_lifecycle_scripts(groups, "InstanceGroups")
        for index, spec in enumerate(groups):
            _add_group(session, runtime, caller, cluster, spec, f"InstanceGroups[{index}]", now)
        session.flush()
        reconcile(session, runtime, _groups(session, cluster), now, actions)
        after_commit(session, lambda: _run_actions(runtime, actions))
    return cluster


def update(runtime: ServiceContext, caller: Caller, request: ClusterUpdate) -> Cluster:
    """Change the groups it lists, delete InstanceGroupsToDelete, leave the others as they are."""
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        cluster = get(session, runtime, caller, request.name)
        _check_in_service(cluster)
        specs = request.groups
        _check_unique_names(specs, "InstanceGroups")
        _check_lifecycle_scripts(specs, "InstanceGroups")
        doomed = set(request.groups_to_delete)
        existing = {g.name: g for g in _groups(session, cluster)}
        for name in doomed:
            if name not in existing:
                raise ValidationError(
                    f"InstanceGroupsToDelete: cluster {cluster.name} has no group {name!r}."
                )
            if any(spec.name == name for spec in specs):
                raise ValidationError(f"InstanceGroups: group {name!r} is also in InstanceGroupsToDelete.")
        touched = []
        for index, spec in enumerate(specs):
            where = f"InstanceGroups[{index}]"
            group = existing.get(spec.name)
            if group is None:
                touched.append(_add_group(session, runtime, caller, cluster, spec, where, now))
            else:
                _change_group(session, runtime, caller, cluster, group, spec, where)
                touched.append(group)
        for name in doomed:
            _remove_group(session, existing[name], actions, now)
        session.flush()
        reconcile(session, runtime, _groups(session, cluster), now, actions)
        after_commit(session, lambda: _run_actions(runtime, actions))
    return cluster


def delete(runtime: ServiceContext, caller: Caller, name: str) -> Cluster:
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        cluster = get(session, runtime, caller, name)
        if cluster.status == ClusterStatus.DELETING:
            raise Conflict(f"Cluster {cluster.name} is already being deleted.")
        status.change(session, CLUSTER_LIFECYCLE, cluster, ClusterStatus.DELETING, now, "DeleteCluster.")
        for group in _groups(session, cluster):
            _remove_group(session, group, actions, now)
        after_commit(session, lambda: _run_actions(runtime, actions))
    runtime.wakes.nodes.notify()
    return cluster


def delete_nodes(
    runtime: ServiceContext, caller: Caller, name: str, instance_ids: Iterable[str]
) -> tuple[list[str], list[tuple[str, str, str]]]:
    """BatchDeleteClusterNodes: each node goes, and its group's target drops by one (so it stays gone)."""
    now = runtime.clock.now()
    actions = NodeActions()
    done: list[str] = []
    failed: list[tuple[str, str, str]] = []
    with runtime.db.write() as session:
        cluster = get(session, runtime, caller, name)
        _check_in_service(cluster)
        for instance_id in instance_ids:
            node = session.scalar(
                select(ClusterNode).where(
                    ClusterNode.cluster_id == cluster.id, ClusterNode.instance_id == instance_id
                )
            )
            if node is None or node.status == GONE:
                failed.append(
                    (instance_id, "NodeIdNotFound", f"Cluster {cluster.name} has no node {instance_id}.")
                )
                continue
            if node.status == NodeStatus.SHUTTING_DOWN:
                failed.append(
                    (instance_id, "InvalidNodeStatus", f"Node {instance_id} is already shutting down.")
                )
                continue
            group = session.get(InstanceGroup, node.group_id)
            assert group is not None
            group.target_count = max(group.target_count - 1, 0)
            _shut_down(session, node, actions, now)
            done.append(instance_id)
        session.flush()
        reconcile(session, runtime, _groups(session, cluster), now, actions)
        after_commit(session, lambda: _run_actions(runtime, actions))
    return done, failed


def _check_in_service(cluster: Cluster) -> None:
    if cluster.status != ClusterStatus.IN_SERVICE:
        raise Conflict(f"Cluster {cluster.name} is {cluster.status}; it cannot be changed now.")


def _check_lifecycle_scripts(specs: Sequence[InstanceGroupSpec], where: str) -> None:
    for index, spec in enumerate(specs):
        check_lifecycle_script(f"{where}[{index}]", spec.lifecycle.on_create)
        if spec.lifecycle.source_uri:
            _check_source_uri(spec.lifecycle.source_uri, f"{where}[{index}].LifeCycleConfig.SourceS3Uri")


def _check_source_uri(uri: str, where: str) -> None:
    """Refused now, naming the URI, rather than when the first node would copy it."""
    try:
        parse_s3_uri(uri)
    except StorageError as exc:
        raise ValidationError(f"{where}: {exc.reason} ({uri}).") from None


def _check_unique_names(specs: Sequence[InstanceGroupSpec], where: str) -> None:
    names = [spec.name for spec in specs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValidationError(f"{where}: group name(s) {', '.join(repeated)} appear more than once.")


def _new_cluster_id(session: Session) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    while True:
        candidate = "".join(secrets.choice(alphabet) for _ in range(12))
        if session.scalar(select(Cluster.id).where(Cluster.cluster_id == candidate)) is None:
            return candidate


# -- groups -------------------------------------------------------------------------------------------


def _add_group(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    cluster: Cluster,
    spec: InstanceGroupSpec,
    where: str,
    now: datetime,
) -> InstanceGroup:
    plan, zone = _placement(session, runtime, caller, cluster, spec, where, group=None)
    group = InstanceGroup(
        cluster_id=cluster.id,
        name=spec.name,
        instance_type=spec.instance_type,
        target_count=spec.instance_count,
        plan_id=plan.id if plan else None,
        availability_zone=zone,
        spec=spec.to_json(),
        created_at=now,
    )
    session.add(group)
    session.flush()
    return group


def _change_group(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    cluster: Cluster,
    group: InstanceGroup,
    spec: InstanceGroupSpec,
    where: str,
) -> None:
    if spec.instance_type and spec.instance_type != group.instance_type:
        raise ValidationError(
            f"{where}.InstanceType: group {group.name} is {group.instance_type}; a group's instance type "
            "cannot change (delete the group and add a new one)."
        )
    plan, zone = _placement(session, runtime, caller, cluster, spec, where, group=group)
    if (plan.id if plan else None) != group.plan_id:
        capacity_claims.give_back(session, _consumer(group), runtime.clock.now())
    group.plan_id = plan.id if plan else None
    group.availability_zone = zone
    group.target_count = spec.instance_count
    group.spec = spec.to_json()


def _remove_group(session: Session, group: InstanceGroup, actions: NodeActions, now: datetime) -> None:
    capacity_claims.give_back(session, _consumer(group), now)
    group.target_count = 0
    for node in _live_nodes(session, group):
        _shut_down(session, node, actions, now)


def _placement(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    cluster: Cluster,
    spec: InstanceGroupSpec,
    where: str,
    group: InstanceGroup | None,
) -> tuple[TrainingPlan | None, str]:
    """The plan (or none) and the zone of a group, once every rule allows it."""
    if spec.instance_type is None:
        raise ValidationError(
            f"{where}.InstanceType is required: this deployment does not serve InstanceRequirements."
        )
    facts = _group_facts(runtime, cluster, spec, where)
    check_subnets(facts)
    arn = spec.plan_arn
    if arn:
        plan = _plan_by_arn(session, runtime, caller, arn)
        check_binding(facts, _plan_facts(session, runtime, plan) if plan else None, arn)
        assert plan is not None
        return plan, _plan_zone(session, plan)
    return None, _on_demand_zone(session, runtime, facts, spec.instance_count, group)


def _group_facts(
    runtime: ServiceContext, cluster: Cluster, spec: InstanceGroupSpec, where: str
) -> GroupFacts:
    subnets = spec.override_subnets
    if subnets is None:
        subnets = ClusterSettings.from_json(cluster.settings).subnets
    zones = {s: runtime.fleet.zone_of_subnet(s) for s in subnets}
    return GroupFacts(
        where=where,
        name=spec.name,
        instance_type=spec.instance_type or "",  # checked by the caller
        subnet_zones=frozenset(z.name for z in zones.values() if z is not None),
        unknown_subnets=tuple(s for s, z in zones.items() if z is None),
        capacity_requirements=spec.capacity_requirements,
    )


def _plan_by_arn(session: Session, runtime: ServiceContext, caller: Caller, arn: str) -> TrainingPlan | None:
    prefix = runtime.arn(caller.account_id, "training-plan/")
    if not arn.startswith(prefix):
        return None
    return session.scalar(
        select(TrainingPlan).where(
            TrainingPlan.account_id == caller.account_id, TrainingPlan.name == arn.removeprefix(prefix)
        )
    )


def _plan_facts(session: Session, runtime: ServiceContext, plan: TrainingPlan) -> PlanFacts:
    zones = frozenset(rc.availability_zone for rc in lifecycle.segments_of(session, plan.id))
    return PlanFacts(
        runtime.arn(plan.account_id, f"training-plan/{plan.name}"),
        plan.target,
        plan.status,
        plan.instance_type,
        zones,
    )


def _plan_zone(session: Session, plan: TrainingPlan) -> str:
    return lifecycle.segments_of(session, plan.id)[0].availability_zone


def _on_demand_zone(
    session: Session, runtime: ServiceContext, facts: GroupFacts, count: int, group: InstanceGroup | None
) -> str:
    """The pool with the most free on-demand instances among the group's zones; refused when short."""
    pools = [
        p
        for p in runtime.fleet.pools_of_type(facts.instance_type)
        if not facts.subnet_zones or p.availability_zone in facts.subnet_zones
    ]
    if not pools:
        raise ValidationError(
            f"{facts.where}.InstanceType: this fleet has no {facts.instance_type} in "
            f"{', '.join(sorted(facts.subnet_zones)) or 'any zone'}."
        )
    free = {p.availability_zone: _on_demand_free(session, p, group) for p in pools}
    best = max(pools, key=lambda p: (free[p.availability_zone], p.availability_zone))
    if count > free[best.availability_zone]:
        described = ", ".join(f"{z}: {n} free" for z, n in sorted(free.items()))
        raise ResourceLimitExceeded(
            f"{facts.where}: group {facts.name} asks for {count} on-demand {facts.instance_type}, but the "
            f"pools it may use have {described} (on-demand: the instances the fleet keeps out of plans). "
            "Buy a training plan, or ask for fewer."
        )
    return best.availability_zone


def _on_demand_free(session: Session, pool: Pool, group: InstanceGroup | None) -> int:
    # Shared with training jobs without a plan: both use the pool's on-demand instances.
    return on_demand.free(session, pool, exclude_group=group.id if group is not None else None)


# -- reconciling nodes with plans and targets -----------------------------------------------------


def reconcile(
    session: Session,
    runtime: ServiceContext,
    groups: Iterable[InstanceGroup],
    now: datetime,
    actions: NodeActions,
) -> None:
    """Bring each group's live nodes to what it should have now; plan groups claim their share."""
    shares: dict[int, int] = {}
    for group in groups:
        if group.plan_id is None:
            _converge(session, runtime, group, group.target_count, "0", now, actions)
            continue
        if group.id not in shares:
            shares.update(_plan_shares(session, runtime, group.plan_id, now))
        expiry = _segment_expiry(session, group.plan_id, now)
        _converge(session, runtime, group, shares.get(group.id, 0), expiry, now, actions)


def reconcile_plan(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> None:
    """A plan changed (segment start, reclaim, end, failure): its groups follow, at once."""
    groups = list(
        session.scalars(
            select(InstanceGroup).where(InstanceGroup.plan_id == plan_id).order_by(InstanceGroup.id)
        )
    )
    if not groups:
        return
    actions = NodeActions()
    reconcile(session, runtime, groups, now, actions)
    after_commit(session, lambda: _run_actions(runtime, actions))


def _plan_shares(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> dict[int, int]:
    """Each group's share of the plan's open segment, in creation order; none outside one or from reclaim."""
    plan = session.get(TrainingPlan, plan_id)
    groups = list(
        session.scalars(
            select(InstanceGroup)
            .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
            .where(InstanceGroup.plan_id == plan_id, Cluster.status == ClusterStatus.IN_SERVICE)
            .order_by(InstanceGroup.id)
        )
    )
    segment = capacity_claims.open_segment(session, plan, now) if plan else None
    lead = runtime.fleet.policy.reclaim_lead_for("hyperpod-cluster")
    usable = (
        plan is not None
        and plan.status == PlanStatus.ACTIVE
        and segment is not None
        and now < segment.end - lead
    )
    shares = allocate([(g.id, g.target_count) for g in groups], segment.count if usable and segment else 0)
    for group in groups:  # the plan's counters follow what the groups hold
        capacity_claims.give_back(session, _consumer(group), now, plan_id=plan_id)
        if plan is not None and shares[group.id]:
            capacity_claims.take(session, plan, _consumer(group), shares[group.id], now)
    return shares


def _segment_expiry(session: Session, plan_id: int, now: datetime) -> str:
    segment = session.scalar(
        select(ReservedCapacity).where(
            ReservedCapacity.plan_id == plan_id, ReservedCapacity.start <= now, ReservedCapacity.end > now
        )
    )
    return str(int(segment.end.timestamp())) if segment else "0"


def _converge(
    session: Session,
    runtime: ServiceContext,
    group: InstanceGroup,
    wanted: int,
    expiry: str,
    now: datetime,
    actions: NodeActions,
) -> None:
    nodes = _live_nodes(session, group)
    # Failed and still-pending nodes go first, then the newest.
    nodes.sort(key=lambda n: (n.status == NodeStatus.RUNNING, -n.id))
    for node in nodes[: max(len(nodes) - wanted, 0)]:
        _shut_down(session, node, actions, now, expiry)
    spec = InstanceGroupSpec.from_json(group.spec)
    for _ in range(wanted - len(nodes)):
        node = _new_node(session, group, runtime.region, now)
        actions.provision.append((node, spec, expiry))


def _new_node(session: Session, group: InstanceGroup, region: str, now: datetime) -> ClusterNode:
    instance_id = "i-" + secrets.token_hex(9)[:17]
    # The model's pattern for PrivateDnsHostname is ip-A-B-C-D.<domain>, as EC2 names its hosts.
    octets = "-".join(str(1 + secrets.randbelow(250)) for _ in range(2))
    node = ClusterNode(
        cluster_id=group.cluster_id,
        group_id=group.id,
        instance_id=instance_id,
        backend_id=f"node-{instance_id}",
        hostname=f"ip-10-1-{octets}.{region}.compute.internal",
        availability_zone=group.availability_zone,
        on_plan=group.plan_id is not None,
        status=NODE_LIFECYCLE.initial,
        message="Provisioning: running the lifecycle scripts.",
        launched_at=now,
    )
    session.add(node)
    session.flush()
    return node


def _shut_down(
    session: Session, node: ClusterNode, actions: NodeActions, now: datetime, expiry: str = "0"
) -> None:
    message = "Shutting down: SIGTERM sent; SIGKILL follows after the grace period."
    move_node(session, node, NodeStatus.SHUTTING_DOWN, message, now)
    actions.terminate.append((node.backend_id, expiry))


def _live_nodes(session: Session, group: InstanceGroup) -> list[ClusterNode]:
    return list(
        session.scalars(
            select(ClusterNode)
            .where(ClusterNode.group_id == group.id, ClusterNode.status.in_(LIVE))
            .order_by(ClusterNode.id)
        )
    )


def _consumer(group: InstanceGroup) -> str:
    return f"cluster-group:{group.id}"


def _groups(session: Session, cluster: Cluster) -> list[InstanceGroup]:
    return list(
        session.scalars(
            select(InstanceGroup).where(InstanceGroup.cluster_id == cluster.id).order_by(InstanceGroup.id)
        )
    )


# -- after a restart -------------------------------------------------------------------------------


def node_refs(runtime: ServiceContext) -> list[NodeRef]:
    """Every node the store knows, for the one `adopt` call of a start (see services/adoption.py)."""
    with runtime.db.read() as session:
        return [NodeRef(b) for b in session.scalars(select(ClusterNode.backend_id))]


def settle_adoption(runtime: ServiceContext, report: AdoptReport) -> None:
    """After the back end took over the known nodes: those it never had are settled in the store."""
    missing = {ref.node_id for ref in report.missing if isinstance(ref, NodeRef)}
    if missing:
        now = runtime.clock.now()
        with runtime.db.write() as session:
            for node in session.scalars(select(ClusterNode).where(ClusterNode.backend_id.in_(missing))):
                if node.status == NodeStatus.SHUTTING_DOWN:
                    status.change(session, NODE_LIFECYCLE, node, GONE, now, "Gone when the server started.")
                    node.ended_at = now
                elif node.status != GONE:  # recorded, never handed over: the server died in between
                    _fail_unprovisioned(session, node, now)


def _fail_unprovisioned(session: Session, node: ClusterNode, now: datetime) -> None:
    message = "The server stopped before the node was provisioned."
    if node.status == NodeStatus.FAILURE:
        node.message = message  # failed already: no move, only the reason
    else:
        move_node(session, node, NodeStatus.FAILURE, message, now)


def reconcile_all(runtime: ServiceContext) -> None:
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        groups = list(
            session.scalars(
                select(InstanceGroup)
                .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
                .where(Cluster.status == ClusterStatus.IN_SERVICE)
                .order_by(InstanceGroup.id)
            )
        )
        reconcile(session, runtime, groups, now, actions)
        after_commit(session, lambda: _run_actions(runtime, actions))


# -- reading ------------------------------------------------------------------------------------------


def get(session: Session, runtime: ServiceContext, caller: Caller, name_or_arn: str) -> Cluster:
    prefix = runtime.arn(caller.account_id, "cluster/")
    column = Cluster.cluster_id if name_or_arn.startswith(prefix) else Cluster.name
    cluster = session.scalar(
        select(Cluster).where(
            Cluster.account_id == caller.account_id, column == name_or_arn.removeprefix(prefix)
        )
    )
    if cluster is None:
        raise ResourceNotFound(f"Cluster {name_or_arn} does not exist.")
    return cluster


def groups_of(session: Session, cluster: Cluster) -> list[InstanceGroup]:
    return _groups(session, cluster)


def nodes_of(session: Session, cluster: Cluster) -> list[ClusterNode]:
    return list(
        session.scalars(
            select(ClusterNode)
            .where(ClusterNode.cluster_id == cluster.id, ClusterNode.status != GONE)
            .order_by(ClusterNode.id)
        )
    )


def running_count(session: Session, group: InstanceGroup) -> int:
    return int(
        session.scalar(
            select(func.count(ClusterNode.id)).where(
                ClusterNode.group_id == group.id, ClusterNode.status == NodeStatus.RUNNING
            )
        )
        or 0
    )


EXEC_OUTPUT_LIMIT_ENV = "HYPERPLAN_EXEC_OUTPUT_LIMIT"
MAX_EXEC_OUTPUT_LIMIT = 64 << 20  # the answer carries both streams as JSON text, in one response


def exec_output_limit(env: Mapping[str, str] | None = None) -> int:
    """Bytes of each of stdout and stderr an exec returns: HYPERPLAN_EXEC_OUTPUT_LIMIT in the server's
    environment, 1 MiB by default. Output beyond it is dropped (the answer says so), so that a chatty
    command cannot make the server hold it all."""
    text = (os.environ if env is None else env).get(EXEC_OUTPUT_LIMIT_ENV)
    if not text:
        return EXEC_OUTPUT_LIMIT
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_EXEC_OUTPUT_LIMIT:
        raise ValidationError(
            f"The server's {EXEC_OUTPUT_LIMIT_ENV}={text!r} is not a number of bytes from 1 to "
            f"{MAX_EXEC_OUTPUT_LIMIT}; its administrator must fix it."
        )
    return int(text)


def exec_on_node(
    runtime: ServiceContext,
    caller: Caller,
    cluster_name: str,
    node_ref: str,
    argv: list[str],
    timeout: timedelta,
) -> ExecResult:
    with runtime.db.read() as session:
        cluster = get(session, runtime, caller, cluster_name)
        node = next((n for n in nodes_of(session, cluster) if node_ref in (n.instance_id, n.hostname)), None)
        if node is None:
            raise ResourceNotFound(f"Cluster {cluster.name} has no node {node_ref}.")
        if node.status != NodeStatus.RUNNING:
            raise Conflict(f"Node {node.instance_id} is {node.status}; commands run on Running nodes only.")
        backend_id = node.backend_id
    return runtime.backend.exec(backend_id, argv, timeout, output_limit=exec_output_limit())


def list_clusters(session: Session, account_id: str) -> list[Cluster]:
    return list(session.scalars(select(Cluster).where(Cluster.account_id == account_id).order_by(Cluster.id)))


def cluster_arn(runtime: ServiceContext, cluster: Cluster) -> str:
    return runtime.arn(cluster.account_id, f"cluster/{cluster.cluster_id}")
