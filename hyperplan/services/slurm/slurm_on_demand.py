"""On-demand work on a Slurm fleet, looked after by each reservation pass (slurm_reservations).

On-demand cluster nodes and training jobs run in the partition, outside reservations. Two things end
an on-demand cluster node, and in both its group gets a new instance at once (a new instance id, as
HyperPod does), whose Slurm job Slurm places on a free node of the pool when there is one (else it waits,
Pending, until one frees):

- **Its Slurm node fails** (DOWN, DRAIN, FAIL...: the pass's health rule): automatic node recovery, as
  for nodes on plans, unless the cluster was created with ``NodeRecovery=None``.
- **A plan's reservation takes its Slurm node**: Slurm does not end work for a reservation (hyperplan
  makes them with ``IGNORE_JOBS``), so the node is ended here (SIGTERM, SIGKILL after the grace, as at
  reclaim) once the reservation has started or starts within :data:`LEAD` (real time under the wall
  clock; under a manual or accelerated clock the reservation is made that much service time before its
  segment starts, see slurm_reservations). Reservations prefer nodes that run no on-demand work, so
  this happens only when the pool is short.

An on-demand **training job** on a Slurm node a reservation takes (within :func:`job_lead`) ends as on
the local back end when its capacity is taken back (``admin drain --stop-running``): Stopping, SIGTERM
to its instances and SIGKILL after the reclaim grace, then Stopped with secondary status Interrupted;
it is not run again.

Each node ended is recorded in the audit trail (``cluster-node.recovered``, by the service itself) and
in the node's status message; each job in its status transitions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.jobs import RUNNING, StopReason
from hyperplan.services.clusters import cluster_reconcile
from hyperplan.services.clusters.cluster_nodes import (
    SHUTDOWN_GRACE,
    NodeActions,
    record_on_demand,
    retire,
    run_actions,
)
from hyperplan.services.clusters.cluster_records import LIVE
from hyperplan.services.clusters.cluster_request import ClusterSettings
from hyperplan.services.jobs import spot
from hyperplan.services.jobs.job_records import instances_of, settings_of, sigterm
from hyperplan.services.jobs.job_status import begin_stop
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.slurm.on_demand_time import MARGIN
from hyperplan.slurm.parse import Job
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, TrainingJob

LEAD = MARGIN + SHUTDOWN_GRACE
"""How long before a reservation's start the on-demand cluster nodes on its nodes are ended: SIGKILL
comes before their Slurm time limit (MARGIN before the reservation) would fail them."""


def job_lead(runtime: ServiceContext) -> timedelta:
    """The same for on-demand training jobs, whose instances get the reclaim grace."""
    return MARGIN + settings_of(runtime).reclaim_grace


def lead(runtime: ServiceContext) -> timedelta:
    """How long before a reservation's start any on-demand work on its nodes may have to be ended."""
    return max(LEAD, job_lead(runtime))


def slurm_node_of(node: ClusterNode) -> str:
    """The Slurm node a cluster node runs on: its private DNS name's second label, once placed."""
    labels = node.hostname.split(".")
    return labels[1] if len(labels) > 1 else ""


def police(
    runtime: ServiceContext, unhealthy: Mapping[str, str], taken: Mapping[str, str], pool_nodes: set[str]
) -> None:
    """End and replace the on-demand nodes on a Slurm node that is ``unhealthy`` (name -> Slurm's
    state and reason) or ``taken`` by a reservation (name -> the reservation's name)."""
    if not unhealthy and not taken:
        return
    with runtime.db.read() as session:  # most passes find none: no write then
        if not _ended(session, unhealthy, taken, pool_nodes):
            return
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        groups: dict[int, InstanceGroup] = {}
        for node, group, cluster, why in _ended(session, unhealthy, taken, pool_nodes):
            retire(session, node, actions, now, f"{why}; this on-demand instance is replaced by a new one.")
            record_on_demand(session, now, node, group, cluster, why, SlurmNode=slurm_node_of(node))
            groups[group.id] = group
        cluster_reconcile.reconcile(session, runtime, groups.values(), now, actions)
        after_commit(session, lambda: run_actions(runtime, actions))


def _ended(
    session: Session, unhealthy: Mapping[str, str], taken: Mapping[str, str], pool_nodes: set[str]
) -> list[tuple[ClusterNode, InstanceGroup, Cluster, str]]:
    """The live on-demand nodes to end, with why."""
    rows = session.execute(
        select(ClusterNode, InstanceGroup, Cluster)
        .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
        .join(Cluster, Cluster.id == ClusterNode.cluster_id)
        .where(InstanceGroup.plan_id.is_(None), ClusterNode.status.in_(LIVE))
        .order_by(ClusterNode.id)
    ).all()
    found = []
    for node, group, cluster in rows:
        host = slurm_node_of(node)
        if host not in pool_nodes:
            continue  # not placed yet (its name's second label is the region)
        if host in unhealthy:
            if not ClusterSettings.from_json(cluster.settings).recovers_nodes:
                continue
            found.append((node, group, cluster, f"Slurm node {host} is {unhealthy[host]}"))
        elif host in taken:
            found.append(
                (node, group, cluster, f"Slurm node {host} is taken by the plan reservation {taken[host]}")
            )
    return found


# -- on-demand training jobs -----------------------------------------------------------------------------


def end_jobs(runtime: ServiceContext, taken: Mapping[str, str], outside: Sequence[Job]) -> None:
    """End, as Interrupted, the running on-demand training jobs whose instances' Slurm jobs (among
    ``outside``: the jobs running outside reservations) are on a node ``taken`` by a reservation (node ->
    the reservation's name)."""
    on_taken = [job for job in outside if set(job.nodes) & taken.keys()]
    prefix = getattr(runtime.backend, "prefix", None)  # of its Slurm jobs' names (backends/slurm.py)
    if not on_taken or not isinstance(prefix, str):
        return
    with runtime.db.read() as session:  # most often none (a node's job, ending): no write then
        if not _jobs_on(session, prefix, on_taken):
            return
    now = runtime.clock.now()
    grace = settings_of(runtime).reclaim_grace
    with runtime.db.write() as session:
        for job, slurm_job in _jobs_on(session, prefix, on_taken):
            host = next(node for node in slurm_job.nodes if node in taken)
            if job.spot:  # a managed spot job waits again and resumes from its checkpoints (spot.py)
                spot.interrupt(session, runtime, job, "on-demand-taken", grace, now)
                continue
            why = (
                f"Its on-demand capacity is taken back: Slurm node {host} is taken by the plan reservation "
                f"{taken[host]}; {sigterm(grace)} It ends Interrupted."
            )
            begin_stop(session, runtime, job, StopReason.INTERRUPTED, why, grace, now)
    runtime.wakes.jobs.notify()


def _jobs_on(session: Session, prefix: str, candidates: Sequence[Job]) -> list[tuple[TrainingJob, Job]]:
    """The running on-demand training jobs whose current attempt runs as one of `candidates`: the Slurm
    job of an instance (named ``PREFIXt.<task id>.<nonce>``) or of its instances' group
    (``PREFIXg.job-<id>-attempt-<n>``), with that Slurm job."""
    jobs = session.scalars(
        select(TrainingJob)
        .where(TrainingJob.plan_id.is_(None), TrainingJob.secondary_status.in_([s.value for s in RUNNING]))
        .order_by(TrainingJob.id)
    )
    found = []
    for job in jobs:
        group = f"{prefix}g.job-{job.id}-attempt-{job.attempt}"
        tasks = tuple(f"{prefix}t.{i.task_id}." for i in instances_of(session, job.id, job.attempt))
        slurm_job = next((c for c in candidates if c.name == group or c.name.startswith(tasks)), None)
        if slurm_job is not None:
            found.append((job, slurm_job))
    return found
