"""The rules of managed spot training on lent capacity, as data and pure functions: no store, no clock, no
process in sight (services/jobs/spot.py applies them).

- **Lending.** A plan lends nothing unless its owner says so. A lending plan (:class:`Lending`) lends the
  instances of its Active segment that run none of the owner's work (:func:`lendable`), promises each
  borrower a notice before taking them back, lets a borrower run a minimum time before it is chosen over
  younger ones, and stops lending a margin before each segment's reclaim time
  (:func:`stop_lending_at`, :func:`may_start_loan`). The fleet's ``[spot]`` table gives the defaults and
  the longest notice (:func:`lending_from`). Wire users set it with the plan's tag ``hyperplan:lending``
  (:func:`parse_lending_tag`, :meth:`Lending.tag_value`).
- **Reclaims.** When the owner needs instances back, the borrowers' runs to interrupt are chosen
  (:func:`choose_reclaims`) and given a deadline (:func:`reclaim_deadline`); the promise was kept if the
  owner had the instances by then, allowing the kill itself a grace (:func:`promise_kept`).
- **Money.** A borrower pays the spot price (:func:`spot_price`) per second its run held instances
  (:func:`run_charge`); the lending plan's owner is credited a share of it (:func:`owner_credit`).
- **Requests and times.** A spot request's stopping condition (:func:`check_spot_request`), and the two
  times SageMaker reports for it (:func:`training_seconds`, :func:`billable_seconds`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from typing import Any

from hyperplan.core.fleet import SPOT_SPAN_CEILING, SpotPolicy
from hyperplan.errors import ValidationError

LENDING_TAG = "hyperplan:lending"
DEFAULT_MAX_RUNTIME_SECONDS = 86_400  # SageMaker's MaxRuntimeInSeconds when a request leaves it out

# The tag's words for a Lending's fields, in the order tag_value writes them.
_TAG_SETTINGS = {"notice": "notice", "min-run": "min_run", "margin": "stop_margin"}
_MAX_TAG_DIGITS = 18
_TAG_PREFIX = f"Tag {LENDING_TAG}: "
_TAG_GRAMMAR = "none, or idle with optional notice=SECONDS, min-run=SECONDS and margin=SECONDS"


# -- lending -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lending:
    """A plan's lending policy, mode ``idle``: its idle instances are lent. "none", the default, is the
    absence of one."""

    notice: timedelta  # how long before the owner has an instance back a borrower is told
    min_run: timedelta  # a borrower's run younger than this is reclaimed only after the older ones
    stop_margin: timedelta  # no loan starts this close to a segment's reclaim time

    def tag_value(self) -> str:
        """The value of the plan's tag ``hyperplan:lending`` that says this policy, in whole seconds:
        ``idle notice=120 min-run=300 margin=900``; :func:`parse_lending_tag` reads it back."""
        seconds = {word: int(getattr(self, field).total_seconds()) for word, field in _TAG_SETTINGS.items()}
        return " ".join(["idle", *(f"{word}={value}" for word, value in seconds.items())])


def lending_from(
    spot: SpotPolicy,
    notice: int | None = None,
    min_run: int | None = None,
    stop_margin: int | None = None,
    *,
    names: Mapping[str, str] | None = None,
) -> Lending:
    """A lending policy from seconds, each None taking the fleet's default.

    The notice is at least a second (a borrower must hear of the reclaim before its kill) and at most the
    fleet's ``max_notice`` (the owner's work waits that long: the fleet bounds it); the minimum run and
    the margin are between 0 and 7 days. ``names`` maps ``notice``, ``min_run`` and ``stop_margin`` to
    what the caller's request calls them, so that a ValidationError names the caller's field, such as
    ``NoticeSeconds (900) is longer than the fleet's longest notice, 600 seconds.``."""
    spelled = names or {}
    return _checked_lending(
        spot,
        {"notice": notice, "min_run": min_run, "stop_margin": stop_margin},
        lambda field, value: f"{spelled.get(field, field)} ({value})",
        prefix="",
    )


def parse_lending_tag(value: str, spot: SpotPolicy) -> Lending | None:
    """The lending policy the tag ``hyperplan:lending`` says: None for ``none`` (the plan lends nothing);
    for ``idle``, optionally followed by ``notice=SECONDS``, ``min-run=SECONDS`` and ``margin=SECONDS``
    separated by spaces, in any order, each at most once, a :class:`Lending` (a setting left out takes the
    fleet's default). SageMaker's tag values allow no ``;`` or ``,``, hence spaces and ``=``.

    A ValidationError names the tag and what is wrong, such as ``Tag hyperplan:lending: notice=900 is
    longer than the fleet's longest notice, 600 seconds.``."""
    words = value.split()
    if not words:
        raise _tag_error(f"the value is empty; write {_TAG_GRAMMAR}.")
    mode, settings = words[0], words[1:]
    if mode == "none":
        if settings:
            raise _tag_error(f"none takes no settings (found {settings[0]!r}).")
        return None
    if mode != "idle":
        raise _tag_error(f"{mode!r} is not a lending mode; write {_TAG_GRAMMAR}.")
    seconds: dict[str, int | None] = dict.fromkeys(_TAG_SETTINGS.values())
    written: dict[str, str] = {}
    for setting in settings:
        word, number = _tag_setting(setting)
        field = _TAG_SETTINGS[word]
        if field in written:
            raise _tag_error(f"{word} is given twice ({written[field]} and {setting}).")
        written[field] = setting
        seconds[field] = number
    words_of = {field: word for word, field in _TAG_SETTINGS.items()}
    return _checked_lending(spot, seconds, lambda field, n: f"{words_of[field]}={n}", prefix=_TAG_PREFIX)


def _tag_error(message: str) -> ValidationError:
    return ValidationError(_TAG_PREFIX + message)


def _tag_setting(setting: str) -> tuple[str, int]:
    """One ``word=SECONDS`` of the tag: a known word and a whole number of seconds."""
    word, equals, number = setting.partition("=")
    if not equals:
        raise _tag_error(f"{setting!r} is not a setting; write {_TAG_GRAMMAR}.")
    if word not in _TAG_SETTINGS:
        *others, last = _TAG_SETTINGS
        known = f"{', '.join(others)} and {last}"
        raise _tag_error(f"{word!r} is not a setting (the settings are {known}).")
    if not (number.isascii() and number.isdigit()):
        raise _tag_error(f"{setting} is not a whole number of seconds.")
    if len(number.lstrip("0")) > _MAX_TAG_DIGITS:  # far beyond any bound; int() of it is not worth doing
        raise _tag_error(f"{word}={number[:12]}...: the number is too long.")
    return word, int(number)


def _checked_lending(
    spot: SpotPolicy,
    seconds: Mapping[str, int | None],
    subject: Callable[[str, int], str],
    prefix: str,
) -> Lending:
    """The defaults filled in and each value checked against its bounds before it becomes a timedelta
    (so that a huge number is refused by name, not left to overflow). ``subject(field, value)`` says how
    the caller writes a value in a message."""
    defaults = {"notice": spot.notice, "min_run": spot.min_run, "stop_margin": spot.stop_margin}
    bounds = {
        "notice": (1, spot.max_notice, "the fleet's longest notice"),
        "min_run": (0, SPOT_SPAN_CEILING, "the longest allowed"),
        "stop_margin": (0, SPOT_SPAN_CEILING, "the longest allowed"),
    }
    values: dict[str, timedelta] = {}
    for field, default in defaults.items():
        given = seconds.get(field)
        if given is None:
            values[field] = default
            continue
        least, most, most_name = bounds[field]
        longest = int(most.total_seconds())
        if given < least:
            unit = "second" if least == 1 else "seconds"
            raise ValidationError(f"{prefix}{subject(field, given)} must be at least {least} {unit}.")
        if given > longest:
            raise ValidationError(
                f"{prefix}{subject(field, given)} is longer than {most_name}, {longest} seconds."
            )
        values[field] = timedelta(seconds=given)
    if values["stop_margin"] < values["notice"]:
        # At the stop-lending point the borrowers get their notice, which must end by the reclaim time.
        margin, notice = (int(values[f].total_seconds()) for f in ("stop_margin", "notice"))
        raise ValidationError(
            f"{prefix}{subject('stop_margin', margin)} is shorter than {subject('notice', notice)}: the "
            "borrowers' notice at the stop-lending point must end by the segment's reclaim time."
        )
    return Lending(**values)


def lendable(segment_count: int, owner_in_use: int, lent: int) -> int:
    """Instances of a plan's Active segment a new loan may take: those that run none of the owner's work
    and are not already lent; never below 0 (the owner may use more than is left while a reclaim is under
    way, and a count below 0 would read as a debt)."""
    return max(0, segment_count - owner_in_use - lent)


def stop_lending_at(reclaim_at: datetime, lending: Lending) -> datetime:
    """When a segment stops lending: its reclaim time less the margin, so that the last loans can end, or
    be reclaimed with their full notice, well before the segment's capacity is taken back from everyone."""
    return reclaim_at - lending.stop_margin


def may_start_loan(now: datetime, reclaim_at: datetime, lending: Lending) -> bool:
    """Whether a loan may start now on a segment reclaimed at ``reclaim_at``: only before the stop-lending
    point, and only if the borrower can run its minimum run before it; a run cut short at once would cost
    the borrower a start and the owner a reclaim for nothing."""
    stop = stop_lending_at(reclaim_at, lending)
    return now < stop and now + lending.min_run <= stop


# -- reclaims ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loan:
    """A borrower's open run on a plan's instances, as a reclaim sees it."""

    run_id: int
    count: int  # instances it holds
    started_at: datetime
    reclaiming: bool  # already told to give them back


def choose_reclaims(loans: Sequence[Loan], needed: int, now: datetime, lending: Lending) -> list[int]:
    """The runs to reclaim so that at least ``needed`` instances come back, counting those already being
    reclaimed (they are on their way: taking more would interrupt a borrower for nothing).

    Runs past their minimum run come first, longest-running first (they have had their promised time and
    the most of it); the younger ones follow, again the longest-running first, because the owner never
    waits past the notice for a borrower's minimum run. Ties go to the lower run id, so the choice is the
    same wherever it is made. When the loans hold fewer than needed, every run not yet being reclaimed
    is chosen."""
    coming_back = sum(loan.count for loan in loans if loan.reclaiming)
    if coming_back >= needed:
        return []
    candidates = sorted(
        (loan for loan in loans if not loan.reclaiming),
        key=lambda loan: (now - loan.started_at < lending.min_run, loan.started_at, loan.run_id),
    )
    chosen: list[int] = []
    for loan in candidates:
        if coming_back >= needed:
            break
        chosen.append(loan.run_id)
        coming_back += loan.count
    return chosen


def reclaim_deadline(now: datetime, lending: Lending, hard_end: datetime | None) -> datetime:
    """When a reclaim told now must be done: after the plan's notice, but never after ``hard_end`` (the
    segment's reclaim time), when the capacity goes whatever a borrower was promised. A hard end already
    past gives a deadline in the past: the run is killed at once."""
    deadline = now + lending.notice
    return deadline if hard_end is None else min(deadline, hard_end)


def promise_kept(
    requested_at: datetime, owner_had_at: datetime, deadline: datetime, kill_grace: timedelta
) -> bool:
    """Whether a reclaim kept its promise: the owner had the instances back within the notice given
    (``deadline - requested_at``) plus the fleet's grace for the kill itself (SIGKILL and the processes'
    end take a moment the borrower cannot shorten)."""
    return owner_had_at - requested_at <= (deadline - requested_at) + kill_grace


# -- money ---------------------------------------------------------------------------------------------


def spot_price(on_demand_price: Decimal, spot: SpotPolicy) -> Decimal:
    """The spot price per instance-hour: the fleet's fraction of the pool's on-demand price, exact (a
    run's charge is rounded once, at its end, rather than its price now)."""
    return on_demand_price * spot.price_fraction


def run_charge(price_per_instance_hour: Decimal, count: int, seconds: float, places: int) -> Decimal:
    """What a run costs its borrower: ``count x seconds x price / 3600``, rounded half up to ``places``
    decimals (the currency's minor unit). Spot time is charged per second it held instances, not per
    started hour as on-demand use is: a borrower interrupted by a reclaim did not choose to stop."""
    if seconds < 0:
        raise ValueError(f"a run cannot last {seconds} seconds")
    exact = price_per_instance_hour * count * Decimal(repr(seconds)) / 3600
    return exact.quantize(_minor_unit(places), rounding=ROUND_HALF_UP)


def owner_credit(charge: Decimal, share: Decimal, places: int) -> Decimal:
    """What a lending plan's owner is credited for a run: its share of the borrower's charge, rounded
    down to ``places`` decimals, so that it never exceeds the charge and the rest (the charge less the
    credit, the operator's) is a whole number of minor units: the ledger adds up."""
    if charge < 0 or not 0 <= share <= 1:
        raise ValueError(f"a credit of share {share} of a charge of {charge}")
    return (charge * share).quantize(_minor_unit(places), rounding=ROUND_DOWN)


def _minor_unit(places: int) -> Decimal:
    return Decimal(1).scaleb(-places)


# -- requests and reported times -----------------------------------------------------------------------


def check_spot_request(stopping: Mapping[str, Any], names_plan: bool) -> int:
    """The ``MaxWaitTimeInSeconds`` of a request with ``EnableManagedSpotTraining`` true, as SageMaker
    checks it: required, and at least ``MaxRuntimeInSeconds`` (one day when absent), because it bounds
    the wait for spot capacity plus the run. A spot job names no plan (``names_plan``): it runs on idle
    instances lent by plans, or on free on-demand capacity."""
    if names_plan:
        raise ValidationError(
            "ResourceConfig.TrainingPlanArn: a managed spot training job runs on idle or on-demand capacity "
            "and names no plan; leave out EnableManagedSpotTraining to run on the plan."
        )
    max_wait = stopping.get("MaxWaitTimeInSeconds")
    if max_wait is None:
        raise ValidationError(
            "StoppingCondition.MaxWaitTimeInSeconds is required with EnableManagedSpotTraining: it bounds "
            "the wait for spot capacity plus the run."
        )
    max_runtime = stopping.get("MaxRuntimeInSeconds")
    if max_runtime is None:
        max_runtime = DEFAULT_MAX_RUNTIME_SECONDS
    if max_wait < max_runtime:
        raise ValidationError(
            f"StoppingCondition.MaxWaitTimeInSeconds ({max_wait}) must be at least MaxRuntimeInSeconds "
            f"({max_runtime}): it bounds the wait for spot capacity plus the run."
        )
    return int(max_wait)


def training_seconds(first_start: datetime | None, end: datetime | None, now: datetime) -> int:
    """A spot job's ``TrainingTimeInSeconds``: from its first start to its end (now while it lasts), waits
    and interruptions included, as SageMaker reports it; 0 before it first starts."""
    if first_start is None:
        return 0
    return max(0, int(((end or now) - first_start).total_seconds()))


def billable_seconds(runs: Sequence[tuple[datetime, datetime | None]], now: datetime) -> int:
    """A spot job's ``BillableTimeInSeconds``: the seconds its runs held instances (an open run until
    now), whole seconds of their sum, so it never exceeds the training time spanning them."""
    held = sum(
        (max(timedelta(0), (ended or now) - started) for started, ended in runs),
        timedelta(0),
    )
    return int(held.total_seconds())
