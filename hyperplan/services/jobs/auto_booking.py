"""Training jobs that book their own capacity (issue 49; docs/DECISIONS.md, "Consumers").

A job created with an auto-book request (core/auto_book.py: the wire's tag ``hyperplan:auto-book``, the
native route's ``AutoBook`` structure) names no plan and never runs on on-demand capacity: the server
buys a plan for it, on its account's behalf, and from then on the job runs on that plan as if it had
named it (job_queue, jobs.reconcile_plan).

- **Booking** (:func:`book`) runs outside any transaction, because buying a plan
  (services/plans/plans.create) is a checked write of its own: right after the job's creation commits,
  after the commit of any change that fails a plan of any account (its capacity is free again:
  :func:`plan_changed`) and at every hour of service time (the timed event ``job.auto-book``: windows open
  as days pass). It searches every acceptable type at once (plans.search_across, in the window the
  request gives from the job's creation), chooses among the offerings (core/auto_book.choose; in payment
  mode ``budget`` among those the budget pays) and buys the chosen one under the job's name (NAME-2, ...
  when the account has a plan of that name: core/jobs.booked_plan_name), tagged
  ``hyperplan:auto-booked-for`` = the job's name. It is any purchase: quotas, drain, the back end's checks
  and the payment mode apply.
- **Crash-safe, never twice.** The plan's name is recorded on the job (``TrainingJob.auto_book_plan``)
  before the purchase. A booking that finds a name recorded looks for that plan, tagged for the job,
  first and links it rather than buying again; two bookings of one job at once (two processes) buy under
  the one name, which the store lets only one of them have.
- **Linking** the plan sets the job's plan and the instances it runs on (the plan's type and count, in
  ``instance_type``/``instance_count``: DescribeTrainingJob keeps showing the ResourceConfig as sent), and
  says in the job's transitions and the plan's history what was bought and for how much.
- **Waiting.** Nothing acceptable is free: the job waits InProgress/Pending, its message says why
  (core/auto_book.why_none). It fails, saying why, when its window can no longer be met, when
  StoppingCondition.MaxPendingTimeInSeconds has passed since its creation, when the account's budget
  (payment mode ``budget``) pays for none of the acceptable offerings, and when the search refuses what it
  asks (a ValidationError: waiting would not change it). Other refusals (a quota, a drained fleet) make it
  wait and look again.
- **The plan afterwards.** In payment mode ``approval`` the job waits Pending naming the plan's invoice. A
  booked plan that fails before the job ran on it (rejected, not approved in time, cancelled) fails the job.
  A job stopped before its plan started leaves the plan to the account.

Once booked, pending time counts as for any job on a plan (only while its plan can give capacity), from
the booking on; the wait to book counts against MaxPendingTimeInSeconds on its own, from the job's creation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.auto_book import (
    AutoBookRequest,
    Candidate,
    acceptable,
    choose,
    describe,
    met_until,
    why_none,
    window_can_be_met,
)
from hyperplan.core.jobs import TARGET, WAITING, Secondary, booked_plan_name, check_auto_book
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.search_across import merged
from hyperplan.core.search_request import SearchRequest
from hyperplan.core.status import InvoiceStatus
from hyperplan.errors import HyperplanError, ResourceInUse, ValidationError
from hyperplan.events.loop import DueEvent, EventHandler, schedule
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs import job_records
from hyperplan.services.jobs.job_clocks import AUTO_BOOK, cancel_events, event_subject, plan_pending_limits
from hyperplan.services.jobs.job_queue import schedule_plan, usable_segment
from hyperplan.services.jobs.job_records import when
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.jobs.job_status import move, note, open_transition
from hyperplan.services.plans import lifecycle, payments, plans
from hyperplan.services.plans.plans import SignedOffering
from hyperplan.services.plans.tags import Tag
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Account, Invoice, ResourceTag, TrainingJob, TrainingPlan

log = logging.getLogger(__name__)

BOOKED_FOR = "hyperplan:auto-booked-for"
"""The tag on a plan bought for a job: its value is the job's name."""

LOOK_EVERY = timedelta(hours=1)
"""A waiting job looks again at every hour of service time (and when a plan fails)."""

TRIES = 3
"""Searches and purchases one booking makes before it waits: a purchase refused because the offering was
taken since the search, or its name since it was chosen, is tried again with a new search."""

BOOKED_EVENT = "auto-booked"  # the plan's history: bought for a job
UNUSED_EVENT = "auto-booked-unused"  # the plan's history: the job had ended when it was bought

_passes = threading.Lock()  # one booking at a time in this process: each reads what the last one bought
_this_thread = threading.local()


# -- creation ----------------------------------------------------------------------------------------


def check(runtime: ServiceContext, checked: TrainingJobSpec) -> None:
    """CreateTrainingJob's refusals of an auto-book request, before anything is written: what this fleet
    could never book (core/jobs.check_auto_book)."""
    request = checked.auto_book
    assert request is not None
    currency = payments.fleet_currency(runtime.fleet)
    check_auto_book(runtime.fleet, request, currency, checked.auto_book_member)


def begin(
    session: Session, runtime: ServiceContext, job: TrainingJob, request: AutoBookRequest, now: datetime
) -> str:
    """In the creating transaction: the job keeps its request and looks again every hour until it has
    booked (the first booking follows the commit: :func:`book`). Returns where its Starting message says
    it runs."""
    job.auto_book = request.to_json()
    _schedule_look(session, runtime, job, now)
    return f"capacity it books itself ({describe(request, job.created_at)})"


def waiting_to_book(job: TrainingJob) -> bool:
    return job.auto_book is not None and job.plan_id is None and Secondary(job.secondary_status) in WAITING


def booking_request(job: TrainingJob) -> AutoBookRequest | None:
    return AutoBookRequest.from_json(job.auto_book) if job.auto_book is not None else None


# -- when to look again ------------------------------------------------------------------------------


def _schedule_look(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """The job's next look: at the next hour of service time, or sooner at the moment it can wait no
    longer (its MaxPendingTimeInSeconds, or just after the last instant its window can be met), so that
    it fails then, not up to an hour later."""
    cancel_events(session, job, (AUTO_BOOK,))
    due = now.replace(minute=0, second=0, microsecond=0) + LOOK_EVERY
    for deadline in (_max_pending_at(job), _window_missed_at(runtime, job)):
        if deadline is not None and deadline < due:
            due = max(deadline, now)
    schedule(session, AUTO_BOOK, due, subject=event_subject(job))


def _window_missed_at(runtime: ServiceContext, job: TrainingJob) -> datetime | None:
    request, policy = booking_request(job), runtime.fleet.policy
    if request is None:
        return None
    until = met_until(request, job.created_at, policy.lead_time, segment_end=policy.segment_end)
    return None if until is None else until + timedelta(microseconds=1)


def _max_pending_at(job: TrainingJob) -> datetime | None:
    seconds = job_records.request_of(job).stopping.max_pending_seconds
    return job.created_at + timedelta(seconds=seconds) if seconds else None


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    """The timed event of a job waiting to book, for the lifecycle loop: plan the next look, and once
    this transaction has committed, book (a purchase never runs inside another write)."""

    def look(session: Session, event: DueEvent) -> None:
        job = session.get(TrainingJob, int(event.subject.removeprefix("training-job:")))
        if job is None or not waiting_to_book(job):
            return
        _schedule_look(session, runtime, job, event.due_at)
        job_id = job.id
        after_commit(session, lambda: book(runtime, job_id))

    return {AUTO_BOOK: look}


def plan_changed(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> None:
    """A plan changed (in its transaction; jobs.reconcile_plan calls this first, for a plan of any
    target). Once it failed: a job it was bought for that has not run on it fails with it, and once this
    commits every job waiting to book looks again, as the plan's capacity is free."""
    plan = session.get(TrainingPlan, plan_id)
    if plan is None or plan.status != PlanStatus.FAILED:
        return
    bought_for = select(TrainingJob).where(
        TrainingJob.plan_id == plan.id,
        TrainingJob.auto_book.is_not(None),
        TrainingJob.attempt == 0,
        TrainingJob.secondary_status.in_(list(WAITING)),
    )
    for job in session.scalars(bought_for):
        _fail_in(
            session,
            runtime,
            job,
            f"The plan booked for the job, {plan.name}, failed before the job ran on it: "
            f"{plan.status_message}",
            now,
        )
    if not session.info.get(_LOOK_AGAIN):  # once per transaction, however many plans it fails
        session.info[_LOOK_AGAIN] = True
        after_commit(session, lambda: book_waiting(runtime))


_LOOK_AGAIN = "auto_booking.look_again"


# -- booking -----------------------------------------------------------------------------------------


def book(runtime: ServiceContext, job_id: int, caller: Caller | None = None) -> None:
    """Book capacity for one job waiting to book, if it can now (`caller`: who created it, when this
    follows the creation; else the account itself buys)."""
    _guarded(lambda: _book(runtime, job_id, caller))


def book_waiting(runtime: ServiceContext) -> None:
    """Every job waiting to book looks again, oldest first (capacity may have freed)."""
    _guarded(lambda: _book_all(runtime))


def _guarded(work: Callable[[], None]) -> None:
    """Run a booking after a commit. It is work of its own: the change whose commit it follows stands
    whatever happens here, so an error is logged, not raised into that change's answer, and the job
    looks again at its next hour. A booking started while this thread books (the purchase of the first
    failed the plan it bought, its payment short) is skipped: that plan's capacity was free before."""
    if getattr(_this_thread, "booking", False):
        return
    with _passes:
        _this_thread.booking = True
        try:
            work()
        except Exception:
            log.exception("booking capacity for training jobs failed; the jobs look again at the next hour")
        finally:
            _this_thread.booking = False


def _book_all(runtime: ServiceContext) -> None:
    with runtime.db.read() as session:
        ids = list(
            session.scalars(
                select(TrainingJob.id)
                .where(
                    TrainingJob.auto_book.is_not(None),
                    TrainingJob.plan_id.is_(None),
                    TrainingJob.secondary_status.in_(list(WAITING)),
                )
                .order_by(TrainingJob.id)
            )
        )
    for job_id in ids:
        _book(runtime, job_id, None)


@dataclass(frozen=True)
class _Wanted:
    """What one booking needs to know of the job and its account, read once."""

    job_id: int
    job_name: str
    account_id: str
    account_name: str
    account_is_admin: bool
    created_at: datetime
    request: AutoBookRequest
    max_pending_at: datetime | None
    payment_mode: str
    budget: Decimal
    intended: str | None  # the plan's name, recorded before a purchase


def _book(runtime: ServiceContext, job_id: int, caller: Caller | None) -> None:
    now = runtime.clock.now()
    with runtime.db.read() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or not waiting_to_book(job):
            return
        wanted = _wanted(session, job)
        found = _bought_for(session, runtime, wanted, wanted.intended) if wanted.intended else None
    if found is not None:  # bought before a crash (or by another process): link, never buy again
        _link(runtime, job_id, found, now)
        return
    late = _too_late(runtime, wanted, now)
    if late is not None:
        _fail(runtime, job_id, late, now)
        return
    buyer = caller or Caller(wanted.account_id, wanted.account_name, wanted.account_is_admin, "")
    refused = ""
    for _ in range(TRIES):
        outcome = _try_once(runtime, buyer, wanted, now)
        if outcome is None:
            return
        refused = outcome
    _wait(runtime, job_id, f"the purchase was refused: {refused}", now)


def _wanted(session: Session, job: TrainingJob) -> _Wanted:
    account = session.get(Account, job.account_id)
    request = booking_request(job)
    assert account is not None and request is not None
    return _Wanted(
        job_id=job.id,
        job_name=job.name,
        account_id=account.id,
        account_name=account.name,
        account_is_admin=account.is_admin,
        created_at=job.created_at,
        request=request,
        max_pending_at=_max_pending_at(job),
        payment_mode=account.payment_mode,
        budget=account.budget,
        intended=job.auto_book_plan,
    )


def _too_late(runtime: ServiceContext, wanted: _Wanted, now: datetime) -> str | None:
    """Why the job can no longer book, or None."""
    request, policy = wanted.request, runtime.fleet.policy
    if wanted.max_pending_at is not None and now >= wanted.max_pending_at:
        seconds = int((wanted.max_pending_at - wanted.created_at).total_seconds())
        return (
            f"Could not book capacity: StoppingCondition.MaxPendingTimeInSeconds ({seconds}) passed at "
            f"{when(wanted.max_pending_at)} before anything acceptable could be booked "
            f"({describe(request, wanted.created_at)})."
        )
    if not window_can_be_met(
        request, wanted.created_at, now, policy.lead_time, segment_end=policy.segment_end
    ):
        _, end = request.window(wanted.created_at)
        assert end is not None
        return (
            f"Could not book capacity: its window can no longer be met: a plan of {request.days} day(s) "
            f"that starts at {when(now + policy.lead_time)} or later ends after {when(end)}, the end of "
            f"its window ({describe(request, wanted.created_at)})."
        )
    return None


def _try_once(runtime: ServiceContext, buyer: Caller, wanted: _Wanted, now: datetime) -> str | None:
    """One search and, if something acceptable is found, one purchase and its link. None: done (booked,
    waiting or failed, as the job now says); else the refusal of a purchase worth trying again."""
    job_id, request = wanted.job_id, wanted.request
    try:
        offers = _search(runtime, buyer, wanted)
    except ValidationError as refusal:  # what it asks cannot be searched for: waiting changes nothing
        _fail(runtime, job_id, f"Could not book capacity: the search refused it: {refusal.message}", now)
        return None
    except HyperplanError as refusal:  # a quota, a drained fleet: may change
        _wait(runtime, job_id, f"the search was refused: {refusal.message}", now)
        return None
    candidates = [_candidate(rank, signed) for rank, signed in enumerate(offers)]
    affordable = _affordable(runtime, wanted, candidates, now)
    if affordable is None:
        return None
    chosen = choose(affordable, request, wanted.created_at)
    if chosen is None:
        _wait(runtime, job_id, why_none(candidates, request, wanted.created_at), now)
        return None
    name = _intend(runtime, job_id)
    if name is None:  # stopped meanwhile
        return None
    tags = [Tag(BOOKED_FOR, wanted.job_name)]
    try:
        plans.create(runtime, buyer, name, chosen.key, tags)
    except ResourceInUse as refusal:  # its name or its offering was just taken
        with runtime.db.read() as session:
            found = _bought_for(session, runtime, wanted, name)
            taken = _plan_id(session, wanted.account_id, name) is not None
        if found is not None:  # by another booking of this job
            _link(runtime, job_id, found, now)
            return None
        if taken:  # by a plan of the account's own: the next try chooses another name
            _forget_name(runtime, job_id, name)
        return refusal.message
    except HyperplanError as refusal:  # capacity taken since the search, a quota, a drain: try again
        return refusal.message
    _link(runtime, job_id, name, now)
    return None


def _search(runtime: ServiceContext, buyer: Caller, wanted: _Wanted) -> list[SignedOffering]:
    """Every acceptable type searched at once, in the request's window from the job's creation. A type
    the account's quotas refuse does not refuse the others: then each is searched alone, and only when
    every one is refused is the first refusal the answer."""
    request = wanted.request
    start_after, end_before = request.window(wanted.created_at)
    searches = [
        SearchRequest(
            wanted_type.instance_type,
            wanted_type.instance_count,
            request.duration_hours,
            TARGET,
            start_after,
            end_before,
        )
        for wanted_type in request.types
    ]
    try:
        return plans.search_across(runtime, buyer, searches)
    except ValidationError:
        raise
    except HyperplanError as first:
        answers: list[list[SignedOffering]] = []
        for search in searches:
            try:
                answers.append(plans.search_across(runtime, buyer, [search]))
            except HyperplanError:
                continue
        if not answers:
            raise first from None
        return merged(answers, lambda signed: signed.offering)


def _candidate(rank: int, signed: SignedOffering) -> Candidate:
    offering = signed.offering
    return Candidate(
        key=signed.offering_id,
        instance_type=offering.instance_type,
        instance_count=offering.instance_count,
        segments=len(offering.segments),
        start=offering.start,
        end=offering.end,
        price=offering.upfront_fee,
        rank=rank,
    )


def _affordable(
    runtime: ServiceContext, wanted: _Wanted, candidates: Sequence[Candidate], now: datetime
) -> Sequence[Candidate] | None:
    """The offerings the account can pay for: all of them, unless it pays from its budget; then those the
    budget pays. None when the budget pays for none of the acceptable ones: the job has failed, saying so
    (a plan it bought would fail at once, unpaid)."""
    if wanted.payment_mode != "budget":
        return candidates
    fine = [c for c in candidates if acceptable(c, wanted.request, wanted.created_at) is None]
    paid = [c for c in candidates if c.price <= wanted.budget]
    if not fine or any(c.price <= wanted.budget for c in fine):
        return paid
    cheapest = min(fine, key=lambda c: c.price)
    currency = payments.fleet_currency(runtime.fleet)
    _fail(
        runtime,
        wanted.job_id,
        f"Could not book capacity: the account pays for plans from its budget (payment mode budget), "
        f"which holds {wanted.budget:,.2f} {currency}, and the cheapest acceptable offering "
        f"({cheapest.instance_type} x{cheapest.instance_count}) costs {cheapest.price:,.2f} {currency}.",
        now,
    )
    return None


def _bought_for(session: Session, runtime: ServiceContext, wanted: _Wanted, name: str | None) -> str | None:
    """`name`, if the account has a plan of that name bought for this job (tagged for it); else None."""
    if name is None:
        return None
    arn = runtime.arn(wanted.account_id, f"training-plan/{name}")
    tag = session.get(ResourceTag, (arn, BOOKED_FOR))
    if tag is None or tag.value != wanted.job_name:
        return None
    return name if _plan_id(session, wanted.account_id, name) is not None else None


def _plan_id(session: Session, account_id: str, name: str) -> int | None:
    return session.scalar(
        select(TrainingPlan.id).where(TrainingPlan.account_id == account_id, TrainingPlan.name == name)
    )


# -- the job's rows ----------------------------------------------------------------------------------


def _intend(runtime: ServiceContext, job_id: int) -> str | None:
    """The name the job's plan is bought under, recorded before the purchase (the one recorded already,
    if any); None when the job no longer waits to book."""
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or not waiting_to_book(job):
            return None
        if job.auto_book_plan is None:
            taken = session.scalars(
                select(TrainingPlan.name).where(
                    TrainingPlan.account_id == job.account_id,
                    TrainingPlan.name.startswith(job.name[:32], autoescape=True),
                )
            )
            job.auto_book_plan = booked_plan_name(job.name, set(taken))
        return job.auto_book_plan


def _forget_name(runtime: ServiceContext, job_id: int, name: str) -> None:
    """The account took `name` for a plan of its own: the next try chooses another."""
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is not None and job.auto_book_plan == name and job.plan_id is None:
            job.auto_book_plan = None


def _link(runtime: ServiceContext, job_id: int, name: str, now: datetime) -> None:
    """The plan bought for the job becomes its plan (again: nothing changes), or, for a job that no
    longer waits to book, is left to the account."""
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        plan = (
            session.scalar(
                select(TrainingPlan).where(
                    TrainingPlan.account_id == job.account_id, TrainingPlan.name == name
                )
            )
            if job is not None
            else None
        )
        if job is None or plan is None or job.plan_id == plan.id:
            return
        if not waiting_to_book(job):
            lifecycle.record(
                session,
                plan,
                UNUSED_EVENT,
                f"Bought for training job {job.name}, which was {job.status} by then: the plan is the "
                "account's to use.",
                now,
            )
            return
        _link_in(session, runtime, job, plan, now)


def _link_in(
    session: Session, runtime: ServiceContext, job: TrainingJob, plan: TrainingPlan, now: datetime
) -> None:
    segments = lifecycle.segments_of(session, plan.id)
    job.plan_id = plan.id
    job.auto_book_plan = plan.name
    job.instance_type = plan.instance_type
    job.instance_count = segments[0].count
    cancel_events(session, job, (AUTO_BOOK,))
    bought = (
        f"plan {plan.name} ({plan.instance_type} x{job.instance_count}, {len(segments)} segment"
        f"{'' if len(segments) == 1 else 's'}, {plan.upfront_fee:,.2f} {plan.currency})"
    )
    failed = plan.status == PlanStatus.FAILED  # its payment failed as it was bought (the budget, short)
    outcome = "it failed as it was bought, and the job with it" if failed else "the job runs on it"
    lifecycle.record(
        session,
        plan,
        BOOKED_EVENT,
        f"Bought for training job {job.name}, which books its own capacity; {outcome}.",
        now,
    )
    if failed:
        _fail_in(
            session,
            runtime,
            job,
            f"Could not book capacity: {bought} failed as it was bought: {plan.status_message}",
            now,
        )
        return
    message = f"Booked {bought}: {_what_next(session, runtime, plan, segments[0].start, now)}"
    if job.secondary_status == Secondary.STARTING:
        move(session, runtime, job, Secondary.PENDING, message, now)
    else:  # it waited to book: a new entry says it booked, and its pending time counts by the plan's rules
        open_transition(session, job, Secondary.PENDING, message, now)
        job.updated_at = now
        job.pending_since = now
        plan_pending_limits(session, runtime, job, now)
    if usable_segment(session, runtime, plan, now) is not None:
        schedule_plan(session, runtime, plan, now)


def _what_next(
    session: Session, runtime: ServiceContext, plan: TrainingPlan, first_start: datetime, now: datetime
) -> str:
    """What the job waits for once it has its plan, as its message says it."""
    if plan.status == PlanStatus.PENDING:
        invoice = session.scalar(
            select(Invoice).where(Invoice.plan_id == plan.id, Invoice.status == InvoiceStatus.PENDING)
        )
        named = (
            f"invoice {invoice.id} ({invoice.amount:,.2f} {invoice.currency})" if invoice else "its invoice"
        )
        return (
            f"{named} awaits an administrator's approval; once approved, the job starts when the plan's "
            f"first segment starts, at {when(first_start)}, and it fails if the invoice is rejected."
        )
    if usable_segment(session, runtime, plan, now) is not None:
        return "the job starts on it now."
    return f"the job starts when the plan's first segment starts, at {when(first_start)}."


def _wait(runtime: ServiceContext, job_id: int, why: str, now: datetime) -> None:
    """Nothing booked: the job waits, its message saying why and until when."""
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or not waiting_to_book(job):
            return
        message = f"Waiting to book capacity: {why.rstrip('.')}. {_until(job)}"
        if job.secondary_status == Secondary.STARTING:
            move(session, runtime, job, Secondary.PENDING, message, now)
        else:
            note(session, job, message, now)


def _until(job: TrainingJob) -> str:
    request = booking_request(job)
    assert request is not None
    limits = []
    _, end = request.window(job.created_at)
    if end is not None:
        limits.append(f"once its window, ending {when(end)}, can no longer be met")
    deadline = _max_pending_at(job)
    if deadline is not None:
        limits.append(f"at {when(deadline)}, when MaxPendingTimeInSeconds has passed")
    fails = f"; it fails {' or '.join(limits)}" if limits else ""
    return f"It looks again when capacity frees and every hour{fails}."


def _fail(runtime: ServiceContext, job_id: int, reason: str, now: datetime) -> None:
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is not None and waiting_to_book(job):
            _fail_in(session, runtime, job, reason, now)


def _fail_in(session: Session, runtime: ServiceContext, job: TrainingJob, reason: str, now: datetime) -> None:
    job.failure_reason = reason
    move(session, runtime, job, Secondary.FAILED, reason, now)
