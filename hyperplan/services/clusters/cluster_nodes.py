"""Nodes and the back end: a node's status moves, a node recorded or shut down inside a transaction, and
what the back end must do about them (`NodeActions`), run after the commit: lifecycle scripts fetched
and nodes provisioned, or terminated (SIGTERM, SIGKILL after SHUTDOWN_GRACE). After a restart, the
nodes the back end did not have are settled here."""

from __future__ import annotations

import contextlib
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan import metrics
from hyperplan.backends.base import EXPIRATION_VARIABLE, AdoptReport, BackendError, NodeRef, NodeSpec
from hyperplan.core.status import NODE_LIFECYCLE, NodeStatus
from hyperplan.objects.uris import StorageError
from hyperplan.services.accounts import audit
from hyperplan.services.clusters import metering, node_containers
from hyperplan.services.clusters.cluster_records import GONE
from hyperplan.services.clusters.cluster_request import InstanceGroupSpec
from hyperplan.services.runtime import slurm_placement, status, tenancy
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup

SHUTDOWN_GRACE = timedelta(seconds=30)  # real time between SIGTERM and SIGKILL at reclaim or deletion
RECLAIM_HOOK = "on_reclaim.sh"
"""A script of the group's LifeCycleConfig.SourceS3Uri that runs on each Running node when its plan's
capacity is taken back, before its SIGTERM, for at most SHUTDOWN_GRACE (docs/DECISIONS.md, "Reclaim
hook"); no other shutdown runs it."""


@dataclass
class NodeActions:
    provision: list[tuple[ClusterNode, InstanceGroupSpec, str]] = field(
        default_factory=list
    )  # node, its group's specification, expiry
    terminate: list[tuple[str, str, bool]] = field(
        default_factory=list
    )  # backend id, expiry epoch, whether a reclaim (RECLAIM_HOOK runs)


def run_actions(runtime: ServiceContext, actions: NodeActions) -> None:
    for backend_id, expiry, reclaim in actions.terminate:
        hook = RECLAIM_HOOK if reclaim else None
        with contextlib.suppress(BackendError):  # already gone: the watcher settles it
            runtime.backend.terminate(
                NodeRef(backend_id), SHUTDOWN_GRACE, env={EXPIRATION_VARIABLE: expiry}, hook=hook
            )
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
            bucket_rights.storage_for_cluster(runtime, node.cluster_id).download_prefix(source_uri, source)
            if on_create and not (source / on_create).is_file():
                raise StorageError(f"{source_uri.rstrip('/')}/{on_create}", "no such lifecycle script")
        with runtime.db.read() as session:
            group = session.get(InstanceGroup, node.group_id)
            zone = group.availability_zone if group is not None else None
            # The node's own plan (one of its group's), whose segment's reservation it runs in on Slurm.
            where = slurm_placement.placement(
                runtime, session, node.plan_id, spec.instance_type or "", zone=zone
            )
        container = node_containers.node_container(
            runtime, node.cluster_id, spec.instance_type or "", zone, spec.volume_gb
        )
        if container is not None and runtime.slurm is None:
            owner = None  # root in its own user namespace: the account's container ids, not its OS user
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
                placement=where,
                container=container,
                image_login=node_containers.node_image_login(runtime) if container is not None else None,
            )
        )
    except (StorageError, BackendError, ValueError) as exc:
        if isinstance(exc, BackendError):
            metrics.BACKEND_ERRORS.inc()
        _fail_provisioning(runtime, node.id, f"Provisioning failed: {exc}")


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
    if new in (NodeStatus.FAILURE, GONE):
        # An on-demand node is charged while it can work: no hour starts from its failure on
        # (docs/DECISIONS.md, "On-demand use"), whether it is then replaced, kept or shut down.
        metering.stop(session, metering.node_holder(node), now)
    if new == GONE:
        node.plan_id = None  # it runs on no plan any more (a live node's plan is what it holds)


def new_node(
    session: Session, group: InstanceGroup, region: str, now: datetime, plan_id: int | None = None
) -> ClusterNode:
    """A new node of the group, on plan `plan_id` (one of the group's) or, without one, on demand."""
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
        on_plan=plan_id is not None,
        plan_id=plan_id,
        status=NODE_LIFECYCLE.initial,
        message="Provisioning: running the lifecycle scripts.",
        launched_at=now,
    )
    session.add(node)
    session.flush()
    return node


def shut_down(
    session: Session,
    node: ClusterNode,
    actions: NodeActions,
    now: datetime,
    expiry: str = "0",
    reclaim: bool = False,
) -> None:
    """The node goes: SIGTERM, then SIGKILL after SHUTDOWN_GRACE; at a `reclaim` (its plan's capacity
    taken back) its RECLAIM_HOOK, if its lifecycle has one, runs first, for at most SHUTDOWN_GRACE."""
    message = "Shutting down: SIGTERM sent; SIGKILL follows after the grace period."
    if reclaim:
        message = (
            f"Shutting down: its plan's capacity is taken back; {RECLAIM_HOOK} runs if its lifecycle "
            "has one, then SIGTERM; SIGKILL follows after the grace period."
        )
    move_node(session, node, NodeStatus.SHUTTING_DOWN, message, now)
    actions.terminate.append((node.backend_id, expiry, reclaim))


def retire(session: Session, node: ClusterNode, actions: NodeActions, now: datetime, message: str) -> None:
    """A node that automatic node recovery ends (services/clusters/node_recovery.py, and the Slurm
    reconcilers): shut down, its instance back to its plan's share or the on-demand pool once it is
    Terminated, and no hour charged from now on; its group, a node short, is reconciled by the caller."""
    shut_down(session, node, actions, now)
    node.message = message
    metering.stop(session, metering.node_holder(node), now)


def record_on_demand(
    session: Session,
    now: datetime,
    node: ClusterNode,
    group: InstanceGroup,
    cluster: Cluster,
    why: str,
    **more: str,
) -> None:
    """An on-demand node's recovery in the audit trail (a plan's node's is in the plan's history), with
    what the back end adds (``more``: the node that replaced it, the Slurm node it was on)."""
    detail = {"Cluster": cluster.name, "Group": group.name, "Reason": why, **more}
    audit.record(
        session, now, None, "cluster-node.recovered", account_id=cluster.account_id, target=node.instance_id,
        detail=detail,
    )  # fmt: skip


def node_refs(runtime: ServiceContext) -> list[NodeRef]:
    """Every node the store knows, for the one `adopt` call of a start (see
    services/orchestration/adoption.py)."""
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
                    node.plan_id = None
                    metering.stop(session, metering.node_holder(node), now)
                elif node.status != GONE:  # recorded, never handed over: the server died in between
                    _fail_unprovisioned(session, node, now)


def _fail_unprovisioned(session: Session, node: ClusterNode, now: datetime) -> None:
    message = "The server stopped before the node was provisioned."
    if node.status == NodeStatus.FAILURE:
        node.message = message  # failed already: no move, only the reason
    else:
        move_node(session, node, NodeStatus.FAILURE, message, now)
