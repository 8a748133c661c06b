"""Workloads for the planner's simulator (`hyperplan simulate`, docs/PLANNING.md): requests for training
plans arriving over time, read from and written to CSV text, and seeded generators of them.

Times are hours from *hour 0*, the first segment end (11:30 UTC) at or after the simulation's start, so
that day k runs from hour 24 k to hour 24 (k + 1). The CSV's header is exactly ``CSV_HEADER``; an empty
``start_after_h`` or ``end_before_h`` leaves that end of the window at its default (the soonest start;
the policy's horizon). ``choice`` is which offering the buyer takes: the ``first``, the ``cheapest`` or
the ``earliest`` to finish. An optional last column, ``busy_h``, gives the plan's owner's busy intervals,
``START-END`` hours from the plan's start separated by spaces (``0-20 30-46``): while busy, the owner's
work uses all of the plan's instances; empty (or the column left out, as older files do) is busy the
whole plan, so such a plan lends nothing (core/borrowing.py).

Spot jobs, managed spot training jobs that borrow plans' idle instances, are a second CSV
(``SPOT_CSV_HEADER``): when each is submitted, its instances, the hours of running it needs to complete,
its ``MaxWaitTimeInSeconds`` in hours (from its submission, waits and runs together) and how often it
saves a checkpoint (an interruption loses the work since the last one).

The generators draw shapes published from public GPU cluster traces, in instances (nodes of 8 GPUs) and
days: gang sizes are powers of two, small gangs far more common than large ones; durations are heavy
tailed (most jobs short, a few taking most of the capacity). Per shape, the weights of the gang sizes
and the tail of the durations:

* ``philly`` (Microsoft Philly, Jeon et al., ATC '19): mostly one-node jobs, a thin tail of big gangs,
  long durations heavy tailed;
* ``helios`` (SenseTime Helios, Hu et al., SC '21): gangs spread more evenly up to large sizes;
* ``pai`` (Alibaba PAI, Weng et al., NSDI '22): many small gangs, the heaviest duration tail.

They are shapes, not replays: the traces' jobs last minutes to days on GPUs, these plans last days on
nodes; what is kept is the power-of-two gangs and the skew of both distributions.

Beyond the shapes, :class:`WorkloadSpec`'s knobs (issue 54) set the gang sizes and the durations' tail
directly, how long before its window a request arrives (a lead-time :class:`Mix`), how much longer than
the plan its window is (a slack :class:`Mix`), the offered load, and the pools (one per zone); left at
their defaults, a spec gives exactly the workloads it gave before them. ``PRESETS`` names whole specs:
``issue54`` is the workload of issue 54 (one pool of 64, 8 weeks, lead times and slack from small sets).
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from hyperplan.core.fleet import SERVED_TARGETS
from hyperplan.errors import ValidationError

PLAN_COLUMNS = (
    "arrival_h",
    "instance_type",
    "count",
    "days",
    "start_after_h",
    "end_before_h",
    "target",
    "choice",
)
CSV_HEADER = (*PLAN_COLUMNS, "busy_h")  # PLAN_COLUMNS alone is read too: the files from before busy_h
SPOT_CSV_HEADER = ("arrival_h", "instance_type", "count", "run_h", "max_wait_h", "checkpoint_h")
CHOICES = ("first", "cheapest", "earliest")

Hours = tuple[float, float]  # [start, end) in hours


@dataclass(frozen=True)
class WorkloadRequest:
    arrival_h: float  # when the buyer searches
    instance_type: str
    count: int
    days: int
    start_after_h: float | None  # None: the default (the soonest start)
    end_before_h: float | None  # None: the default (the policy's horizon after the arrival)
    target: str = "training-job"
    choice: str = "first"
    # The owner's busy intervals, hours from the plan's start, sorted and disjoint; empty: the whole plan.
    busy_h: tuple[Hours, ...] = ()

    @property
    def instance_days(self) -> int:
        return self.count * self.days


@dataclass(frozen=True)
class SpotJob:
    """A managed spot training job of the workload: it borrows idle instances of plans (core/borrowing.py)."""

    arrival_h: float  # when it is submitted
    instance_type: str
    count: int
    run_h: float  # hours of running it needs to complete
    max_wait_h: float  # its MaxWaitTimeInSeconds in hours: from its submission, waiting and running
    checkpoint_h: float  # running hours between its checkpoints


# -- CSV ---------------------------------------------------------------------------------------------


def read_csv(text: str) -> list[WorkloadRequest]:
    """The requests of a workload's CSV text, in arrival order (stable); a ValidationError names the line
    and the column that is wrong. The header is ``CSV_HEADER``, or ``PLAN_COLUMNS`` (no busy intervals)."""
    return sorted(
        (_request(cells) for cells in _rows(text, "workload", (CSV_HEADER, PLAN_COLUMNS))),
        key=lambda r: r.arrival_h,
    )


def read_spot_csv(text: str) -> list[SpotJob]:
    """The spot jobs of a CSV text whose header is ``SPOT_CSV_HEADER``, in arrival order (stable); a
    ValidationError names the line and the column that is wrong."""
    return sorted(
        (_spot_job(cells) for cells in _rows(text, "spot jobs", (SPOT_CSV_HEADER,))),
        key=lambda j: j.arrival_h,
    )


class _Cells:
    """One CSV line's cells by column, read into values; each refusal names the file, line and column."""

    def __init__(self, what: str, line: int, cells: dict[str, str]) -> None:
        self.what, self.line, self.cells = what, line, cells

    def fail(self, column: str, why: str) -> ValidationError:
        return ValidationError(f"{self.what} line {self.line}, {column}: {self.cells[column]!r} {why}")

    def text(self, column: str) -> str:
        if not self.cells[column]:
            raise self.fail(column, "is empty")
        return self.cells[column]

    def hours(self, column: str) -> float:
        return _hours_at_or_after_zero(self.cells[column], lambda why: self.fail(column, why))

    def optional_hours(self, column: str) -> float | None:
        return self.hours(column) if self.cells[column] else None

    def positive_hours(self, column: str) -> float:
        value = self.hours(column)
        if value <= 0:
            raise self.fail(column, "is not a number of hours above 0")
        return value

    def whole(self, column: str) -> int:
        if not self.cells[column].isdigit() or int(self.cells[column]) < 1:
            raise self.fail(column, "is not a positive whole number")
        return int(self.cells[column])

    def one_of(self, column: str, allowed: tuple[str, ...]) -> str:
        if self.cells[column] not in allowed:
            raise self.fail(column, f"is not one of {', '.join(allowed)}")
        return self.cells[column]


def _rows(text: str, what: str, headers: tuple[tuple[str, ...], ...]) -> list[_Cells]:
    """The non-blank lines after the header (the first of ``headers`` is the one asked for; the others
    are older forms still read), each as its cells by column."""
    rows = list(csv.reader(io.StringIO(text)))
    header = tuple(cell.strip() for cell in rows[0]) if rows else ()
    if header not in headers:
        older = "".join(f" (or {','.join(h)})" for h in headers[1:])
        raise ValidationError(f"{what}: the first line must be the header {','.join(headers[0])}{older}")
    out = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise ValidationError(f"{what} line {line}: {len(row)} columns, not {len(header)}")
        out.append(_Cells(what, line, dict(zip(header, (cell.strip() for cell in row), strict=True))))
    return out


def _hours_at_or_after_zero(text: str, fail: Callable[[str], ValidationError]) -> float:
    try:
        value = float(text)
    except ValueError:
        raise fail("is not a number of hours") from None
    if not math.isfinite(value) or value < 0:
        raise fail("is not a number of hours at or after hour 0")
    return value


def _request(cells: _Cells) -> WorkloadRequest:
    arrival = cells.hours("arrival_h")
    start_after, end_before = cells.optional_hours("start_after_h"), cells.optional_hours("end_before_h")
    instance_type = cells.text("instance_type")
    target, choice = cells.one_of("target", SERVED_TARGETS), cells.one_of("choice", CHOICES)
    if start_after is not None and end_before is not None and end_before <= start_after:
        raise cells.fail("end_before_h", "is not after start_after_h")
    return WorkloadRequest(
        arrival, instance_type, cells.whole("count"), cells.whole("days"), start_after, end_before,
        target, choice, _busy_hours(cells),
    )  # fmt: skip


def _busy_hours(cells: _Cells) -> tuple[Hours, ...]:
    """The ``busy_h`` cell's intervals, sorted and with those that overlap or touch joined (the owner is
    busy in either, so the union is what it says); none when the column is empty or absent."""
    intervals = []
    for word in cells.cells.get("busy_h", "").split():
        start, dash, end = word.partition("-")

        def fail(why: str, word: str = word) -> ValidationError:
            return cells.fail("busy_h", f"has {word!r}, which {why}")

        if not dash:
            raise fail("is not START-END (hours from the plan's start, such as 0-20)")
        low = _hours_at_or_after_zero(start, lambda why: fail(f"starts with what {why}"))
        high = _hours_at_or_after_zero(end, lambda why: fail(f"ends with what {why}"))
        if high <= low:
            raise fail("does not end after it starts")
        intervals.append((low, high))
    return _joined(intervals)


def _joined(intervals: list[Hours]) -> tuple[Hours, ...]:
    joined: list[Hours] = []
    for low, high in sorted(intervals):
        if joined and low <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], high))
        else:
            joined.append((low, high))
    return tuple(joined)


def _spot_job(cells: _Cells) -> SpotJob:
    run_h = cells.positive_hours("run_h")
    max_wait_h = cells.positive_hours("max_wait_h")
    if max_wait_h < run_h:  # as SageMaker refuses MaxWaitTimeInSeconds below MaxRuntimeInSeconds
        raise cells.fail("max_wait_h", "is shorter than run_h: the wait counts the running hours too")
    return SpotJob(
        cells.hours("arrival_h"), cells.text("instance_type"), cells.whole("count"), run_h, max_wait_h,
        cells.positive_hours("checkpoint_h"),
    )  # fmt: skip


def write_csv(requests: list[WorkloadRequest]) -> str:
    """The requests as CSV text :func:`read_csv` reads back; the column ``busy_h`` only when some request
    has busy intervals, so that a generated workload is written as it was before the column existed."""
    with_busy = any(r.busy_h for r in requests)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER if with_busy else PLAN_COLUMNS)
    for r in requests:
        row = [_hours(r.arrival_h), r.instance_type, r.count, r.days, _hours(r.start_after_h),
               _hours(r.end_before_h), r.target, r.choice]  # fmt: skip
        if with_busy:
            row.append(" ".join(f"{_hours(low)}-{_hours(high)}" for low, high in r.busy_h))
        writer.writerow(row)
    return out.getvalue()


def write_spot_csv(jobs: list[SpotJob]) -> str:
    """The spot jobs as CSV text :func:`read_spot_csv` reads back."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SPOT_CSV_HEADER)
    for j in jobs:
        writer.writerow(
            [_hours(j.arrival_h), j.instance_type, j.count, _hours(j.run_h), _hours(j.max_wait_h),
             _hours(j.checkpoint_h)]
        )  # fmt: skip
    return out.getvalue()


def _hours(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if value == int(value) else repr(value)


# -- generators --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """Gang sizes (weights of 1, 2, 4, ... instances, cut at half the pool) and durations (a bounded
    Pareto tail of index ``tail``: the smaller, the heavier)."""

    name: str
    count_weights: tuple[float, ...]
    tail: float


SHAPES = {
    "philly": Shape("philly", (0.40, 0.20, 0.15, 0.10, 0.08, 0.05, 0.02), 1.0),
    "helios": Shape("helios", (0.22, 0.18, 0.17, 0.15, 0.13, 0.10, 0.05), 0.9),
    "pai": Shape("pai", (0.45, 0.22, 0.14, 0.09, 0.06, 0.03, 0.01), 0.7),
}


@dataclass(frozen=True)
class Mix:
    """A number of days: one of ``days`` (drawn by ``weights``, equally when empty), plus ``plus``, plus a
    uniform draw in [0, ``jitter``)."""

    days: tuple[float, ...]
    weights: tuple[float, ...] = ()
    plus: float = 0.0
    jitter: float = 0.0

    def draw(self, rng: random.Random) -> float:
        value = rng.choices(self.days, self.weights or None)[0] + self.plus
        return value + rng.uniform(0, self.jitter) if self.jitter else value

    def describe(self) -> str:
        def days(value: float) -> str:
            return f"{value * 24:g} h" if 0 < value < 1 else f"{value:g} d"

        weights = f" weighted {'/'.join(f'{w:g}' for w in self.weights)}" if self.weights else ""
        extra = (f" + {days(self.plus)}" if self.plus else "") + (
            f" + up to {days(self.jitter)}" if self.jitter else ""
        )
        return "{" + ", ".join(days(d) for d in self.days) + "}" + weights + extra


# Lead times (arrival to the window's opening) and slack (the window's length less the plan's), in days:
# the planner bench's grid (bench/planner_grid.py). "issue54" are issue 54's: {30 minutes, 1, 3, 7, 14
# days} plus up to a day, and {0, 1, 2, 7, 14} plus a day; the others are shorter and longer.
LEAD_MIXES = {
    "soon": Mix((1 / 48, 1), jitter=1),
    "issue54": Mix((1 / 48, 1, 3, 7, 14), jitter=1),
    "ahead": Mix((7, 14, 21), jitter=1),
}
SLACK_MIXES = {
    "tight": Mix((0, 1), plus=1),
    "issue54": Mix((0, 1, 2, 7, 14), plus=1),
    "loose": Mix((7, 14, 28), plus=1),
}


@dataclass(frozen=True)
class WorkloadSpec:
    """The issue's workload by default: one pool of 64 over a calendar of 8 weeks; requests arriving over
    the first 4 weeks whose instance-days add up to ``load`` (1.3) times the pool's capacity over the 8
    weeks; gangs of powers of two up to half the pool; 1 to 28 days; each window opening within
    ``max_delay_days`` of the arrival and ``slack`` times as long as the plan (at least a day longer),
    kept inside the 8 weeks where the plan still fits; every buyer taking the first offering."""

    instance_type: str = "ml.p5.48xlarge"
    pool_size: int = 64
    span_days: int = 56
    arrival_days: int = 28
    load: float = 1.3
    min_days: int = 1
    max_days: int = 28
    shape: str = "helios"
    target: str = "training-job"
    choice: str = "first"
    max_delay_days: float = 7.0
    slack: tuple[float, float] = (1.5, 3.0)  # window length / plan length
    default_window_share: float = 0.0  # of the requests, those leaving the window at its defaults
    # Issue 54's knobs. Left at these defaults, the workloads are those of before them, seed for seed.
    zones: int = 1  # pools of the type, one per zone, each of pool_size: the load is of all of them
    count_weights: tuple[float, ...] | None = None  # of 1, 2, 4, ... instances; None: the shape's
    tail: float | None = None  # the durations' Pareto index (the smaller, the heavier); None: the shape's
    lead: Mix | None = None  # days from the arrival to the window's opening; None: up to max_delay_days
    slack_days: Mix | None = None  # days the window is longer than the plan; None: the ratio ``slack``
    # Where the span cuts a window below the plan and a day: True, the window runs past the span to keep
    # them; False, it stays cut, even when the plan no longer fits (no one can book that request).
    keep_fit: bool = True

    @property
    def capacity(self) -> int:
        """Instance-days over the span, of all the pools."""
        return self.pool_size * self.zones * self.span_days


PRESETS = {
    # Issue 54's workload: one pool of 64, 8 weeks; gangs of 1-32, each size half as frequent as the one
    # below (so each offers as many instance-days); whole days 1-28, median 3 (a Pareto of index 0.4);
    # arrivals over the first 4 weeks until 1.3 x the capacity is offered; lead times and slack from
    # LEAD_MIXES and SLACK_MIXES "issue54"; windows cut at the span; buyers take the first offering.
    "issue54": WorkloadSpec(
        count_weights=(32, 16, 8, 4, 2, 1),
        tail=0.4,
        lead=LEAD_MIXES["issue54"],
        slack_days=SLACK_MIXES["issue54"],
        keep_fit=False,
    ),
}


def preset(name: str) -> WorkloadSpec:
    if name not in PRESETS:
        raise ValidationError(f"workload preset {name!r}: one of {', '.join(PRESETS)}")
    return PRESETS[name]


def generate(spec: WorkloadSpec, seed: int) -> list[WorkloadRequest]:
    """Requests in arrival order until their instance-days reach ``load`` x the pool over the span. The
    same spec and seed give the same workload."""
    if spec.shape not in SHAPES:
        raise ValidationError(f"workload shape {spec.shape!r}: one of {', '.join(SHAPES)}")
    shape, rng = SHAPES[spec.shape], random.Random(seed)
    count_weights = spec.count_weights or shape.count_weights
    tail = shape.tail if spec.tail is None else spec.tail
    counts = [2**i for i in range(len(count_weights)) if 2**i <= max(spec.pool_size // 2, 1)]
    weights = count_weights[: len(counts)]
    demand = spec.load * spec.capacity
    sizes: list[tuple[int, int]] = []
    while sum(c * d for c, d in sizes) < demand:
        sizes.append(
            (rng.choices(counts, weights)[0], _bounded_pareto(rng, tail, spec.min_days, spec.max_days))
        )
    arrivals = sorted(float(round(rng.uniform(0, spec.arrival_days * 24))) for _ in sizes)
    out = []
    for arrival, (count, days) in zip(arrivals, sizes, strict=True):
        if spec.lead is None:
            opens = float(round(arrival + rng.uniform(0, spec.max_delay_days * 24)))
        else:  # to the half hour, so that 30 minutes stays 30 minutes
            opens = round(2 * (arrival + 24 * spec.lead.draw(rng))) / 2
        if spec.slack_days is None:
            length = 24 * max(days * rng.uniform(*spec.slack), days + 1)
        else:
            length = 24 * (days + spec.slack_days.draw(rng))
        closes = float(min(math.ceil(opens + length), spec.span_days * 24))
        if spec.keep_fit and closes - opens < 24 * (days + 1):  # cut by the span: keep a day's slack
            closes = float(math.ceil(opens + 24 * (days + 1)))
        default = rng.random() < spec.default_window_share
        start_after, end_before = (None, None) if default else (opens, closes)
        out.append(
            WorkloadRequest(
                arrival, spec.instance_type, count, days, start_after, end_before, spec.target, spec.choice
            )
        )
    return out


def _bounded_pareto(rng: random.Random, alpha: float, low: int, high: int) -> int:
    """A whole number of days from a Pareto of index ``alpha`` cut to [low, high]."""
    u = rng.random()
    lo, hi = float(low), float(high) + 1
    ratio = (lo / hi) ** alpha
    value = lo / (1 - u * (1 - ratio)) ** (1 / alpha)
    return max(low, min(high, int(value)))
