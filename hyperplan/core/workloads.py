"""Workloads for the planner's simulator (`hyperplan simulate`, docs/PLANNING.md): requests for training
plans arriving over time, read from and written to CSV text, and seeded generators of them.

Times are hours from *hour 0*, the first segment end (11:30 UTC) at or after the simulation's start, so
that day k runs from hour 24 k to hour 24 (k + 1). The CSV's header is exactly ``CSV_HEADER``; an empty
``start_after_h`` or ``end_before_h`` leaves that end of the window at its default (the soonest start;
the policy's horizon). ``choice`` is which offering the buyer takes: the ``first``, the ``cheapest`` or
the ``earliest`` to finish.

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
"""

from __future__ import annotations

import csv
import io
import math
import random
from dataclasses import dataclass

from hyperplan.core.fleet import SERVED_TARGETS
from hyperplan.errors import ValidationError

CSV_HEADER = (
    "arrival_h",
    "instance_type",
    "count",
    "days",
    "start_after_h",
    "end_before_h",
    "target",
    "choice",
)
CHOICES = ("first", "cheapest", "earliest")


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

    @property
    def instance_days(self) -> int:
        return self.count * self.days


# -- CSV ---------------------------------------------------------------------------------------------


def read_csv(text: str) -> list[WorkloadRequest]:
    """The requests of a workload's CSV text, in arrival order (stable); a ValidationError names the line
    and the column that is wrong."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or tuple(cell.strip() for cell in rows[0]) != CSV_HEADER:
        raise ValidationError(f"workload: the first line must be the header {','.join(CSV_HEADER)}")
    requests = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(CSV_HEADER):
            raise ValidationError(f"workload line {line}: {len(row)} columns, not {len(CSV_HEADER)}")
        requests.append(_request(line, dict(zip(CSV_HEADER, (cell.strip() for cell in row), strict=True))))
    return sorted(requests, key=lambda r: r.arrival_h)


def _request(line: int, cells: dict[str, str]) -> WorkloadRequest:
    def fail(column: str, why: str) -> ValidationError:
        return ValidationError(f"workload line {line}, {column}: {cells[column]!r} {why}")

    def hours(column: str, optional: bool) -> float | None:
        if optional and not cells[column]:
            return None
        try:
            value = float(cells[column])
        except ValueError:
            raise fail(column, "is not a number of hours") from None
        if not math.isfinite(value) or value < 0:
            raise fail(column, "is not a number of hours at or after hour 0")
        return value

    def whole(column: str) -> int:
        if not cells[column].isdigit() or int(cells[column]) < 1:
            raise fail(column, "is not a positive whole number")
        return int(cells[column])

    arrival = hours("arrival_h", False)
    assert arrival is not None
    start_after, end_before = hours("start_after_h", True), hours("end_before_h", True)
    if not cells["instance_type"]:
        raise fail("instance_type", "is empty")
    if cells["target"] not in SERVED_TARGETS:
        raise fail("target", f"is not one of {', '.join(SERVED_TARGETS)}")
    if cells["choice"] not in CHOICES:
        raise fail("choice", f"is not one of {', '.join(CHOICES)}")
    if start_after is not None and end_before is not None and end_before <= start_after:
        raise fail("end_before_h", "is not after start_after_h")
    return WorkloadRequest(
        arrival, cells["instance_type"], whole("count"), whole("days"), start_after, end_before,
        cells["target"], cells["choice"],
    )  # fmt: skip


def write_csv(requests: list[WorkloadRequest]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for r in requests:
        writer.writerow(
            [_hours(r.arrival_h), r.instance_type, r.count, r.days, _hours(r.start_after_h),
             _hours(r.end_before_h), r.target, r.choice]
        )  # fmt: skip
    return out.getvalue()


def _hours(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if value == int(value) else f"{value:g}"


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


def generate(spec: WorkloadSpec, seed: int) -> list[WorkloadRequest]:
    """Requests in arrival order until their instance-days reach ``load`` x the pool over the span. The
    same spec and seed give the same workload."""
    if spec.shape not in SHAPES:
        raise ValidationError(f"workload shape {spec.shape!r}: one of {', '.join(SHAPES)}")
    shape, rng = SHAPES[spec.shape], random.Random(seed)
    counts = [2**i for i in range(len(shape.count_weights)) if 2**i <= max(spec.pool_size // 2, 1)]
    weights = shape.count_weights[: len(counts)]
    demand = spec.load * spec.pool_size * spec.span_days
    sizes: list[tuple[int, int]] = []
    while sum(c * d for c, d in sizes) < demand:
        sizes.append(
            (rng.choices(counts, weights)[0], _bounded_pareto(rng, shape.tail, spec.min_days, spec.max_days))
        )
    arrivals = sorted(float(round(rng.uniform(0, spec.arrival_days * 24))) for _ in sizes)
    out = []
    for arrival, (count, days) in zip(arrivals, sizes, strict=True):
        opens = float(round(arrival + rng.uniform(0, spec.max_delay_days * 24)))
        length = 24 * max(days * rng.uniform(*spec.slack), days + 1)
        closes = float(min(math.ceil(opens + length), spec.span_days * 24))
        if closes - opens < 24 * (days + 1):  # cut by the span: the window keeps a day's slack
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
