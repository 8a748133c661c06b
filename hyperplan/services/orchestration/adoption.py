"""The one `adopt` call of a server start: the back end takes over every node and task the store knows.

The back-end contract asks for a single call, before anything else touches the back end, with every id
the store knows (ended ones included): whatever it is not told about is killed. Cluster nodes and
training-job tasks are both known here, so each consumer lists its refs and then settles what the
report says about them.
"""

from __future__ import annotations

from hyperplan.backends.base import AdoptReport, Ref
from hyperplan.services.clusters import cluster_nodes
from hyperplan.services.jobs import job_watch
from hyperplan.services.runtime.context import ServiceContext


def adopt_all(runtime: ServiceContext) -> AdoptReport:
    known: list[Ref] = [*cluster_nodes.node_refs(runtime), *job_watch.task_refs(runtime)]
    report = runtime.backend.adopt(known)
    cluster_nodes.settle_adoption(runtime, report)
    job_watch.settle_adoption(runtime, report)
    return report
