"""Retention: ended work's files removed once the fleet's retention period has passed (`[retention]
period` in the fleet file; none: everything is kept), by a background worker (`retention`), which also
runs the retention of rows (`[retention]` events, audit, leases, metering: row_retention.py).

What goes, for a training job that ended (Completed, Failed, Stopped, its last attempt ended) longer ago
than the period: its attempt trees under the work directory (WORK/jobs/<id>) and what the back end keeps
of each of its tasks, logs included (`Backend.forget`). For a cluster node Terminated longer ago: what
the back end keeps of it, its home included (`Backend.forget`), whether its cluster still exists or not.
What stays: the job's and the node's rows (a job is still described, its history read; which rows may
go, and when, is row_retention.py's), and every bucket: the checkpoints and models there are the user's.
Log streams another part keeps elsewhere are removed by the back end's `forget` too; retention knows
only that contract.

Each pass handles what ended between the previous pass's cutoff and its own (kept in the store, so a
restart does not walk everything again); a failure leaves the cutoff where it was, and the next pass
tries again. Service time decides what is old, so a manual clock moved ahead makes work old at once.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from sqlalchemy import select

from hyperplan.backends import disks
from hyperplan.backends.base import NodeRef, TaskRef
from hyperplan.core.jobs import BETWEEN_ATTEMPTS, JobStatus
from hyperplan.core.status import NodeStatus
from hyperplan.services.orchestration import row_retention
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store import settings as stored
from hyperplan.store.schema import ClusterNode, EndedNodeUsage, TrainingJob, TrainingJobInstance
from hyperplan.worker import Worker

log = logging.getLogger(__name__)

THROUGH = "retention.through"  # the cutoff of the last pass that finished
POLL_VARIABLE = "HYPERPLAN_RETENTION_POLL"
DEFAULT_POLL = 600.0  # seconds between passes
ENDED_JOBS = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED)


@dataclass(frozen=True)
class Pass:
    jobs: int  # jobs whose files were removed
    nodes: int  # nodes the back end forgot


def run_once(runtime: ServiceContext) -> Pass:
    period = runtime.fleet.retention.period
    if period is None:
        return Pass(0, 0)
    cutoff = runtime.clock.now() - period
    with runtime.db.read() as session:
        since = stored.get_time(session, THROUGH)
        if since is not None and since >= cutoff:
            return Pass(0, 0)
        jobs = select(TrainingJob).where(
            TrainingJob.status.in_([s.value for s in ENDED_JOBS]),
            TrainingJob.attempt_state.in_(BETWEEN_ATTEMPTS),
            TrainingJob.updated_at <= cutoff,
        )
        if since is not None:
            jobs = jobs.where(TrainingJob.updated_at > since)
        old_jobs = [(job.id, job.name) for job in session.scalars(jobs)]
        tasks = {
            job_id: [
                i.task_id
                for i in session.scalars(
                    select(TrainingJobInstance).where(TrainingJobInstance.job_id == job_id)
                )
            ]
            for job_id, _ in old_jobs
        }
        nodes = select(ClusterNode.backend_id).where(
            ClusterNode.status == NodeStatus.TERMINATED, ClusterNode.ended_at <= cutoff
        )
        if since is not None:
            nodes = nodes.where(ClusterNode.ended_at > since)
        old_nodes = list(session.scalars(nodes))
        deleted = list(
            session.scalars(
                select(EndedNodeUsage.backend_id).where(
                    EndedNodeUsage.backend_id != "", EndedNodeUsage.ended_at <= cutoff
                )
            )
        )
    for job_id, name in old_jobs:
        for task_id in tasks[job_id]:
            runtime.backend.forget(TaskRef(task_id))
        tree = runtime.work_dir / "jobs" / str(job_id)
        if os.path.lexists(tree):
            disks.release_under(tree)  # a disk still mounted there (backends/disks.py) first
            shutil.rmtree(tree)
        log.info("retention: removed the files of training job %s (id %d)", name, job_id)
    for backend_id in [*old_nodes, *deleted]:
        runtime.backend.forget(NodeRef(backend_id))
    with runtime.db.write() as session:
        if deleted:
            for row in session.scalars(select(EndedNodeUsage).where(EndedNodeUsage.backend_id.in_(deleted))):
                row.backend_id = ""
        stored.put_time(session, THROUGH, cutoff)
    return Pass(len(old_jobs), len(old_nodes) + len(deleted))


class RetentionWorker:
    def __init__(self, runtime: ServiceContext) -> None:
        self.runtime = runtime
        poll = float(os.environ.get(POLL_VARIABLE, DEFAULT_POLL))
        self.worker = Worker("retention", self._step, poll=poll)

    def start(self) -> None:
        retention = self.runtime.fleet.retention
        if retention.removes_files or retention.removes_rows:
            self.worker.start()

    def stop(self) -> None:
        if self.worker.running:
            self.worker.stop()

    def _step(self) -> float | None:
        files = run_once(self.runtime)
        rows = row_retention.run_once(self.runtime, stopping=lambda: self.worker.stopping)
        if files.jobs or files.nodes or rows.changed:
            log.info("retention: %s; %s", files, rows)
        return None
