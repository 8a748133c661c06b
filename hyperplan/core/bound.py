"""An upper bound on what any planner could book from a workload, and the exact optimum of small ones
(docs/PLANNING.md), solved with HiGHS (``highspy``): pure computation, no I/O.

A job is a request in whole days: ``count`` instances for ``days`` days, all inside days
``[first, stop)``, in one of ``pools`` (indices into ``capacity``, each pool's reservable count).

The bound is the LP relaxation of the offline problem in which every job may be split at will (any number
of segments, in any pools): variables ``z_j`` (the share of job j that is booked) and ``y_jpt`` (the share
of day t that job j holds in pool p), with

    maximise   sum_j count_j days_j z_j                         (instance-days booked)
    subject to sum_pt y_jpt = days_j z_j                         (a booked job holds its days)
               sum_p y_jpt <= z_j                                (at most one day's worth a day)
               sum_j count_j y_jpt <= capacity_p                 (no pool over its count, any day)
               0 <= y, z <= 1

Every booking a planner can make (whole days, at most ``max_segments`` segments, the partial first day
aside) is a feasible point of it with z_j in {0, 1}, so its optimum is at least the best any planner, even
one that knew the future, could book. It is looser than the true optimum in two ways: jobs may be split
(more than the policy's segments, and fractions of a job), and the split is free. :func:`exact_optimum`
solves the integral problem with one segment per job, for instances small enough, to say how loose.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np


@dataclass(frozen=True)
class Job:
    count: int
    days: int
    first: int  # the first day it may hold
    stop: int  # the day after the last it may hold
    pools: tuple[int, ...]

    @property
    def instance_days(self) -> int:
        return self.count * self.days


def lp_bound(jobs: list[Job], capacity: list[int]) -> float:
    """The LP relaxation's optimum, in instance-days (see the module's docstring)."""
    model = _Model()
    z = [model.var(float(job.instance_days)) for job in jobs]
    held: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for j, job in enumerate(jobs):
        if job.stop - job.first < job.days or not job.pools:
            model.row([(z[j], 1.0)], 0.0, 0.0)
            continue
        total: list[tuple[int, float]] = [(z[j], -float(job.days))]
        for t in range(job.first, job.stop):
            today = [(z[j], -1.0)]
            for p in job.pools:
                y = model.var(0.0)
                total.append((y, 1.0))
                today.append((y, 1.0))
                held.setdefault((p, t), []).append((y, float(job.count)))
            if len(job.pools) > 1:
                model.row(today, -highspy.kHighsInf, 0.0)
        model.row(total, 0.0, 0.0)
    for (p, _), terms in held.items():
        model.row(terms, -highspy.kHighsInf, float(capacity[p]))
    return model.maximise()


def exact_optimum(jobs: list[Job], capacity: list[int]) -> float:
    """The most instance-days a planner placing each job as one segment could book, knowing every job in
    advance (a MIP: one binary per job, pool and start day). For small instances only."""
    model = _Model()
    held: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for job in jobs:
        choices = []
        for p in job.pools:
            for start in range(job.first, job.stop - job.days + 1):
                x = model.var(float(job.instance_days), integer=True)
                choices.append((x, 1.0))
                for t in range(start, start + job.days):
                    held.setdefault((p, t), []).append((x, float(job.count)))
        if choices:
            model.row(choices, -highspy.kHighsInf, 1.0)
    for (p, _), terms in held.items():
        model.row(terms, -highspy.kHighsInf, float(capacity[p]))
    return model.maximise()


class _Model:
    """Columns and rows gathered in Python, handed to HiGHS at once."""

    def __init__(self) -> None:
        self.costs: list[float] = []
        self.integer: list[int] = []
        self.rows: list[tuple[list[tuple[int, float]], float, float]] = []

    def var(self, cost: float, integer: bool = False) -> int:
        self.costs.append(cost)
        if integer:
            self.integer.append(len(self.costs) - 1)
        return len(self.costs) - 1

    def row(self, terms: list[tuple[int, float]], lower: float, upper: float) -> None:
        self.rows.append((terms, lower, upper))

    def maximise(self) -> float:
        if not self.costs:
            return 0.0
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        n = len(self.costs)
        h.addCols(n, np.array(self.costs), np.zeros(n), np.ones(n), 0, np.array([], np.int32),
                  np.array([], np.int32), np.array([], np.float64))  # fmt: skip
        if self.rows:
            starts: list[int] = []
            index: list[int] = []
            value: list[float] = []
            for terms, _, _ in self.rows:
                starts.append(len(index))
                index.extend(t for t, _ in terms)
                value.extend(v for _, v in terms)
            h.addRows(
                len(self.rows),
                np.array([lo for _, lo, _ in self.rows]),
                np.array([hi for _, _, hi in self.rows]),
                len(index),
                np.array(starts, dtype=np.int32),
                np.array(index, dtype=np.int32),
                np.array(value, dtype=np.float64),
            )
        if self.integer:
            kinds = np.array([highspy.HighsVarType.kInteger] * len(self.integer))
            h.changeColsIntegrality(len(self.integer), np.array(self.integer, dtype=np.int32), kinds)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        h.run()
        status = h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError(f"HiGHS: {h.modelStatusToString(status)}")
        return float(h.getInfo().objective_function_value)
