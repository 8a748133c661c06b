"""The fleet's state as Prometheus gauges, read from the store at each scrape (hyperplan/metrics.py says
why here and not as instruments): served only by the process that owns the metrics listener.

Pools are counted as the calendar sees them now: `reserved` instances are those booked by plans (and
the demo's background load) at this instant, `free` the rest of the pool's reservable instances. The
booked ratio is the booked share of a pool's reservable instance-hours over the next 7 and 56 days.
The work directory's size is walked at most once a minute (a big tree takes a moment to walk).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from hyperplan.core.jobs import WAITING, JobStatus
from hyperplan.services.runtime import fleet as fleet_service
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import ClusterNode, ReservedCapacity, TrainingJob, TrainingPlan

HORIZONS = (("7d", 7), ("56d", 56))
WORK_DIR_EVERY = 60.0  # seconds between two walks of the work directory


class FleetCollector(Collector):
    def __init__(self, runtime: ServiceContext) -> None:
        self.runtime = runtime
        self._lock = threading.Lock()
        self._work_dir_bytes: tuple[float, int] | None = None  # (when walked, bytes)

    def collect(self) -> Iterable[Any]:
        runtime = self.runtime
        runtime.sync()  # bookings made by other processes (serve --workers, other servers): seen now
        now = runtime.clock.now()
        instances = GaugeMetricFamily(
            "hyperplan_pool_instances",
            "A pool's reservable instances now: reserved (booked) or free.",
            labels=["instance_type", "zone", "state"],
        )
        ratio = GaugeMetricFamily(
            "hyperplan_pool_booked_ratio",
            "The booked share of a pool's reservable instance-hours over the horizon.",
            labels=["instance_type", "zone", "horizon"],
        )
        for horizon, days in HORIZONS:
            for report in fleet_service.report(runtime, days):
                pool = report.pool
                labels = [pool.instance_type, pool.availability_zone]
                if days == HORIZONS[0][1]:
                    reserved = report.booked_at(now)
                    instances.add_metric([*labels, "reserved"], reserved)
                    instances.add_metric([*labels, "free"], max(pool.reservable - reserved, 0))
                ratio.add_metric([*labels, horizon], round(report.utilisation(), 6))
        yield instances
        yield ratio
        with runtime.db.read() as session:
            plans = _counts(
                session.execute(select(TrainingPlan.status, func.count()).group_by(TrainingPlan.status))
            )
            capacities = _counts(
                session.execute(
                    select(ReservedCapacity.status, func.count()).group_by(ReservedCapacity.status)
                )
            )
            jobs = _counts(
                session.execute(select(TrainingJob.status, func.count()).group_by(TrainingJob.status))
            )
            queued = session.scalar(
                select(func.count()).where(
                    TrainingJob.status == JobStatus.IN_PROGRESS,
                    TrainingJob.secondary_status.in_([s.value for s in WAITING]),
                )
            )
            nodes = _counts(
                session.execute(select(ClusterNode.status, func.count()).group_by(ClusterNode.status))
            )
        yield _by_status("hyperplan_plans", "Training plans, by status.", plans)
        yield _by_status("hyperplan_reserved_capacities", "Plans' segments, by status.", capacities)
        yield _by_status("hyperplan_jobs", "Training jobs, by TrainingJobStatus.", jobs)
        yield GaugeMetricFamily(
            "hyperplan_job_queue_length",
            "Training jobs waiting for capacity (Starting or Pending).",
            queued or 0,
        )
        yield _by_status("hyperplan_nodes", "Cluster nodes, by status.", nodes, label="state")
        yield GaugeMetricFamily(
            "hyperplan_work_dir_bytes",
            "Bytes under the work directory (nodes' homes, job trees, logs), walked at most once a minute.",
            self._work_dir_size(),
        )

    def describe(self) -> Iterable[Any]:
        return []  # nothing read when registered: the store is read at each scrape only

    def _work_dir_size(self) -> int:
        with self._lock:
            cached = self._work_dir_bytes
            if cached is None or time.monotonic() - cached[0] >= WORK_DIR_EVERY:
                cached = self._work_dir_bytes = (time.monotonic(), tree_bytes(self.runtime.work_dir))
            return cached[1]

    def forget_work_dir_size(self) -> None:
        """The next scrape walks the work directory again (after retention removed something)."""
        with self._lock:
            self._work_dir_bytes = None


def _counts(result: Any) -> dict[str, int]:
    return {str(status): int(count) for status, count in result}


def _by_status(
    name: str, documentation: str, counts: dict[str, int], label: str = "status"
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for status, count in sorted(counts.items()):
        family.add_metric([status], count)
    return family


def tree_bytes(root: Path) -> int:
    """The size of every regular file under `root` (links not followed; what vanishes meanwhile skipped)."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total
