"""The rules of training jobs, as data and pure functions: no store, no clock, no process in sight.

- **Statuses.** A job has a SageMaker ``TrainingJobStatus`` and a finer ``SecondaryStatus``; the first
  follows from the second (:data:`PRIMARY`), and :data:`JOB_LIFECYCLE` lists every move the second
  may make. ``Starting`` is where every job begins; a job on a plan waits in ``Pending`` until the plan has
  an open segment with room for it; ``Downloading`` (its instances are being prepared: channels fetched,
  checkpoints restored), ``Training`` (its processes run) and ``Uploading`` (the model is being packed)
  follow. At a segment's reclaim time a running job goes back to ``Pending`` and starts again in the
  next segment. It ends ``Completed``, ``Failed``, or ``Stopped`` with the secondary status saying why:
  ``Stopped`` (StopTrainingJob or MaxPendingTimeInSeconds), ``Interrupted`` (the plan ended first) or
  ``MaxRuntimeExceeded``. ``Stopping`` is the grace period between SIGTERM and the end of the processes.
  A managed spot job (services/jobs/spot.py) waits in ``Pending`` for lent or on-demand capacity, is
  ``SpotInterrupted`` (``Interrupted`` on the wire, still InProgress) while its lent instances are taken
  back, and ends ``MaxWaitTimeExceeded`` when its wait bound runs out.
- **The queue.** First in, first out, but a later job that fits starts when an earlier one does not
  (:func:`select_to_start`).
- **Pending time.** It counts only while the plan could give capacity: from a segment's start to its
  reclaim time (:func:`countable`). That is the plan's Active time minus the reclaim lead, so the gap
  between segments and the minutes after a reclaim, when a job waits because the plan cannot serve
  anyone, never count against it. :func:`reached_at` says when a limit will be reached. A job on several
  plans counts while any of them could (:func:`merged_windows`).
- **Running time.** It counts from the moment a job is given its instances (``Downloading``) until it
  gives them back or is told to stop; :data:`RUNNING` names those statuses.
- **Attempts and instances.** Each time a job is given instances (once per segment it runs in) is an
  attempt, with a state of its own (:data:`ATTEMPT_LIFECYCLE`), and each of its instances too
  (:data:`INSTANCE_LIFECYCLE`).
- **Booking its own capacity.** A job with an auto-book request (core/auto_book.py) names no plan: what
  it asks must be bookable on the fleet (:func:`check_auto_book`), and the plan it buys is named after
  it (:func:`booked_plan_name`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from hyperplan.core.auto_book import TAG_KEY, AutoBookRequest, check_currency
from hyperplan.core.fleet import Fleet
from hyperplan.core.served_types import check_reservable
from hyperplan.core.status import Lifecycle
from hyperplan.errors import ValidationError


class JobStatus(StrEnum):
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"


class Secondary(StrEnum):
    STARTING = "Starting"
    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    TRAINING = "Training"
    UPLOADING = "Uploading"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    INTERRUPTED = "Interrupted"
    MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"
    MAX_WAIT_TIME_EXCEEDED = "MaxWaitTimeExceeded"
    # A managed spot job whose lent instances are being taken back: still InProgress (it waits and
    # resumes), shown on the wire as "Interrupted" (:func:`shown`), stored apart from the final
    # Interrupted so that each stored status has one primary status and one set of moves.
    SPOT_INTERRUPTED = "SpotInterrupted"


PRIMARY: dict[Secondary, JobStatus] = {
    Secondary.STARTING: JobStatus.IN_PROGRESS,
    Secondary.PENDING: JobStatus.IN_PROGRESS,
    Secondary.DOWNLOADING: JobStatus.IN_PROGRESS,
    Secondary.TRAINING: JobStatus.IN_PROGRESS,
    Secondary.UPLOADING: JobStatus.IN_PROGRESS,
    Secondary.COMPLETED: JobStatus.COMPLETED,
    Secondary.FAILED: JobStatus.FAILED,
    Secondary.STOPPING: JobStatus.STOPPING,
    Secondary.STOPPED: JobStatus.STOPPED,
    Secondary.INTERRUPTED: JobStatus.STOPPED,
    Secondary.MAX_RUNTIME_EXCEEDED: JobStatus.STOPPED,
    Secondary.MAX_WAIT_TIME_EXCEEDED: JobStatus.STOPPED,
    Secondary.SPOT_INTERRUPTED: JobStatus.IN_PROGRESS,
}


def shown(secondary: str) -> str:
    """A stored secondary status as SageMaker names it (a spot interruption is "Interrupted")."""
    return Secondary.INTERRUPTED.value if secondary == Secondary.SPOT_INTERRUPTED else secondary


_ENDS = frozenset(
    {Secondary.FAILED, Secondary.STOPPED, Secondary.INTERRUPTED, Secondary.MAX_WAIT_TIME_EXCEEDED}
)

# Every move a job's secondary status may make; anything else is a bug (`Lifecycle.check` refuses it).
_MOVES: dict[Secondary, frozenset[Secondary]] = {
    Secondary.STARTING: frozenset({Secondary.PENDING, Secondary.DOWNLOADING} | _ENDS),
    Secondary.PENDING: frozenset({Secondary.DOWNLOADING} | _ENDS),
    # Downloading may end in Failed (a channel cannot be fetched) or go back to Pending (reclaimed).
    Secondary.DOWNLOADING: frozenset(
        {
            Secondary.TRAINING,
            Secondary.PENDING,
            Secondary.STOPPING,
            Secondary.FAILED,
            Secondary.SPOT_INTERRUPTED,
        }
    ),
    Secondary.TRAINING: frozenset(
        {
            Secondary.UPLOADING,
            Secondary.PENDING,
            Secondary.STOPPING,
            Secondary.FAILED,
            Secondary.SPOT_INTERRUPTED,
        }
    ),
    # A spot job's processes end after the notice; then it waits again, or it is stopped meanwhile.
    Secondary.SPOT_INTERRUPTED: frozenset({Secondary.PENDING, Secondary.STOPPING} | _ENDS),
    Secondary.UPLOADING: frozenset({Secondary.COMPLETED, Secondary.FAILED}),
    Secondary.STOPPING: frozenset(
        {
            Secondary.STOPPED,
            Secondary.INTERRUPTED,
            Secondary.MAX_RUNTIME_EXCEEDED,
            Secondary.MAX_WAIT_TIME_EXCEEDED,
            Secondary.FAILED,
        }
    ),
    Secondary.COMPLETED: frozenset(),
    Secondary.FAILED: frozenset(),
    Secondary.STOPPED: frozenset(),
    Secondary.INTERRUPTED: frozenset(),
    Secondary.MAX_RUNTIME_EXCEEDED: frozenset(),
    Secondary.MAX_WAIT_TIME_EXCEEDED: frozenset(),
}

JOB_LIFECYCLE = Lifecycle(
    kind="training-job",
    noun="training job",
    states=Secondary,
    initial=Secondary.STARTING,
    moves=_MOVES,
)

FINAL = JOB_LIFECYCLE.final
RUNNING = frozenset({Secondary.DOWNLOADING, Secondary.TRAINING})
"""Running time counts in these: the job holds its instances and has not been told to stop."""
WAITING = frozenset({Secondary.STARTING, Secondary.PENDING})
"""A job in these holds nothing and may be given capacity."""


class AttemptState(StrEnum):
    """Where a job's current attempt is (``TrainingJob.attempt_state``, :data:`NO_ATTEMPT` before the
    first): its instances claimed and its tasks being handed to the back end (launching), followed by the
    watcher (running), its tasks ended while the runner stores its checkpoints and model (ending), over
    (ended). The next attempt, in a later segment, is a new one: it starts launching again."""

    LAUNCHING = "launching"
    RUNNING = "running"
    ENDING = "ending"
    ENDED = "ended"


NO_ATTEMPT = ""
"""A job's attempt state before its first attempt."""

ATTEMPT_LIFECYCLE = Lifecycle(
    kind="training-job-attempt",
    noun="training job attempt",
    states=AttemptState,
    initial=AttemptState.LAUNCHING,
    moves={
        # ended at once when none of its tasks could be started (a stop or a reclaim came first)
        AttemptState.LAUNCHING: frozenset({AttemptState.RUNNING, AttemptState.ENDED}),
        AttemptState.RUNNING: frozenset({AttemptState.ENDING}),
        AttemptState.ENDING: frozenset({AttemptState.ENDED}),
        AttemptState.ENDED: frozenset(),
    },
)

HOLDING = frozenset({AttemptState.LAUNCHING, AttemptState.RUNNING})
"""Attempt states in which a job's instances are in use."""
BETWEEN_ATTEMPTS = frozenset({NO_ATTEMPT, AttemptState.ENDED})
"""Attempt states in which a job holds nothing and may be given a new attempt."""


class InstanceState(StrEnum):
    """One instance of an attempt (a back-end task): recorded before the back end has it, then as the
    back end reports it, or NotStarted when the attempt ended before it was handed over."""

    RECORDED = "Recorded"
    RUNNING = "Running"
    EXITED = "Exited"
    KILLED = "Killed"
    LOST = "Lost"
    NOT_STARTED = "NotStarted"


_INSTANCE_ENDS = frozenset({InstanceState.EXITED, InstanceState.KILLED, InstanceState.LOST})

INSTANCE_LIFECYCLE = Lifecycle(
    kind="training-job-instance",
    noun="training job instance",
    states=InstanceState,
    initial=InstanceState.RECORDED,
    moves={
        InstanceState.RECORDED: frozenset(
            {InstanceState.RUNNING, InstanceState.NOT_STARTED, *_INSTANCE_ENDS}
        ),
        InstanceState.RUNNING: _INSTANCE_ENDS,
        InstanceState.EXITED: frozenset(),
        InstanceState.KILLED: frozenset(),
        InstanceState.LOST: frozenset(),
        InstanceState.NOT_STARTED: frozenset(),
    },
)

LIVE_INSTANCE = frozenset({InstanceState.RECORDED, InstanceState.RUNNING})
"""Instance states whose task may still run."""


class StopReason(StrEnum):
    """Why a job is being ended; it picks the final secondary status once its processes are gone."""

    USER = "user"  # StopTrainingJob
    MAX_RUNTIME = "max-runtime"
    INTERRUPTED = "interrupted"  # the plan's last segment was taken back
    FAILED = "failed"  # an instance failed; the others are being stopped
    MAX_WAIT = "max-wait"  # a spot job's MaxWaitTimeInSeconds ran out while it ran


FINAL_FOR_STOP: dict[StopReason, Secondary] = {
    StopReason.USER: Secondary.STOPPED,
    StopReason.MAX_RUNTIME: Secondary.MAX_RUNTIME_EXCEEDED,
    StopReason.INTERRUPTED: Secondary.INTERRUPTED,
    StopReason.FAILED: Secondary.FAILED,
    StopReason.MAX_WAIT: Secondary.MAX_WAIT_TIME_EXCEEDED,
}


# -- the queue ------------------------------------------------------------------------------------


def select_to_start(queue: Sequence[tuple[int, int]], free: int) -> list[int]:
    """Which waiting jobs, given as (job id, instance count) oldest first, start with `free` instances.

    First in, first out, with backfill: each job in turn starts if it fits in what is left; one that does
    not fit is passed over (it keeps its place) and a later, smaller one may start instead.
    """
    started = []
    for job_id, count in queue:
        if 0 < count <= free:
            started.append(job_id)
            free -= count
    return started


# -- pending and running time -----------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A stretch of time in which a plan could give capacity: a segment's start to its reclaim time."""

    start: datetime
    end: datetime


def usable_windows(segments: Iterable[tuple[datetime, datetime]], reclaim_lead: timedelta) -> list[Window]:
    """From (start, end) of each segment that holds capacity, in any order."""
    windows = [Window(start, max(start, end - reclaim_lead)) for start, end in segments]
    return sorted((w for w in windows if w.end > w.start), key=lambda w: w.start)


def countable(since: datetime, until: datetime, windows: Sequence[Window]) -> timedelta:
    """How much of [since, until) falls in the windows: the pending time a job accrues over it."""
    total = timedelta(0)
    for window in windows:
        start, end = max(since, window.start), min(until, window.end)
        if end > start:
            total += end - start
    return total


def reached_at(
    since: datetime, already: timedelta, limit: timedelta, windows: Sequence[Window]
) -> datetime | None:
    """When a job pending from `since`, with `already` counted before, reaches `limit` of pending time;
    None if the windows end first (the plan runs out before the limit does)."""
    remaining = limit - already
    if remaining <= timedelta(0):
        return since
    for window in windows:
        start = max(since, window.start)
        if window.end <= start:
            continue
        if remaining <= window.end - start:
            return start + remaining
        remaining -= window.end - start
    return None


def has_capacity_left(windows: Sequence[Window], now: datetime) -> bool:
    """Whether the plan may still give capacity at or after `now`."""
    return any(window.end > now for window in windows)


def merged_windows(windows: Iterable[Window]) -> list[Window]:
    """The windows of a job's several plans as one list, in time order, overlapping or touching ones
    joined: the job could be given capacity whenever any of its plans could, and an hour in which two of
    them could counts once against its pending limits."""
    merged: list[Window] = []
    for window in sorted(windows, key=lambda w: (w.start, w.end)):
        if merged and window.start <= merged[-1].end:
            merged[-1] = Window(merged[-1].start, max(merged[-1].end, window.end))
        else:
            merged.append(window)
    return merged


def next_opening(windows: Sequence[Window], now: datetime) -> datetime | None:
    """When the first window that has not begun by `now` begins; None when none is left to begin."""
    return min((window.start for window in windows if window.start > now), default=None)


# -- binding to a plan --------------------------------------------------------------------------------

TARGET = "training-job"
USABLE_PLAN_STATUSES = ("Scheduled", "Active")


@dataclass(frozen=True)
class PlanFacts:
    arn: str
    target: str
    status: str
    instance_type: str
    instance_count: int
    capacity_left: bool  # whether any segment can still give capacity (before its reclaim time)


def check_plan(
    plan: PlanFacts | None,
    plan_arn: str,
    instance_type: str,
    instance_count: int,
    field: str = "ResourceConfig.TrainingPlanArn",
) -> None:
    """Refuse, naming the rule, a plan that may not run this job. `plan` is None when the caller has no
    plan by that ARN (absent, or another account's: the same answer either way). `field` names where the
    plan was given: CreateTrainingJob's member, or the native route's further plan."""
    if plan is None:
        raise ValidationError(f"{field}: this account has no training plan {plan_arn} (plan-ownership rule).")
    if plan.target != TARGET:
        raise ValidationError(
            f"{field}: plan {plan.arn} serves {plan.target}; training jobs need a plan for {TARGET} "
            "(plan-target rule)."
        )
    if plan.status not in USABLE_PLAN_STATUSES:
        raise ValidationError(
            f"{field}: plan {plan.arn} is {plan.status}; it must be Scheduled or Active (plan-status rule)."
        )
    if not plan.capacity_left:
        raise ValidationError(
            f"{field}: plan {plan.arn} has no capacity left to give: its last segment's capacity has been "
            "taken back (plan-status rule)."
        )
    if plan.instance_type != instance_type:
        raise ValidationError(
            f"ResourceConfig.InstanceType: plan {plan.arn} reserves {plan.instance_type}, but the job asks "
            f"for {instance_type}; they must be the same (instance-type rule)."
        )
    if instance_count > plan.instance_count:
        raise ValidationError(
            f"ResourceConfig.InstanceCount: {instance_count} is more than plan {plan.arn}'s "
            f"{plan.instance_count} instances; a job on a plan runs only on the plan's capacity, never on "
            "on-demand capacity (plan-capacity rule)."
        )


# -- booking its own capacity -----------------------------------------------------------------------

MAX_PLAN_NAME = 64  # the SageMaker model's TrainingPlanName


def check_auto_book(fleet: Fleet, request: AutoBookRequest, currency: str, member: str | None) -> None:
    """Refuse, naming the part, an auto-book request this fleet could never book: a type no plan can
    reserve, a count its plans do not hold, a duration outside its plans' days, a price limit in another
    currency. `member` names the native structure (``AutoBook``); None: the request is the tag's."""
    policy = fleet.policy
    for index, wanted in enumerate(request.types):
        where = f"{member}.InstanceTypes[{index}]" if member else f"{TAG_KEY}: types"
        instance_type, count = wanted.instance_type, wanted.instance_count
        check_reservable(fleet, instance_type, f"{where}.InstanceType" if member else where)
        allowed = policy.allowed_counts
        if allowed is not None and count not in allowed:
            listed = ", ".join(map(str, allowed))
            raise ValidationError(
                f"{where}: {instance_type} x{count}: plans hold {listed} instances, not {count}."
            )
        largest = max(pool.reservable for pool in fleet.pools_of_type(instance_type))
        if count > largest:
            raise ValidationError(
                f"{where}: {instance_type} x{count}: the largest {instance_type} pool holds {largest}."
            )
    days = request.duration_hours // 24
    if not policy.min_days <= days <= policy.max_days:
        where = f"{member}.DurationHours" if member else f"{TAG_KEY}: days"
        raise ValidationError(
            f"{where}: plans last {policy.min_days} to {policy.max_days} days here, not {days}."
        )
    check_currency(request, currency, member)


def booked_plan_name(job_name: str, taken: Collection[str]) -> str:
    """The name of the plan a job books for itself: the job's own, or, when the account has a plan of
    that name, the first of NAME-2, NAME-3, ... it has not (each at most the model's 64 characters: the
    job's name is cut to make room for the number)."""
    if job_name not in taken:
        return job_name[:MAX_PLAN_NAME]
    number = 2
    while True:
        suffix = f"-{number}"
        candidate = job_name[: MAX_PLAN_NAME - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        number += 1
