"""Warnings before a segment's reclaim, and the extension policy's choice: values in, values out.

A segment's capacity is taken back at its reclaim time (its end minus the target's reclaim lead). An
account is warned at lead times it sets (hours before that instant; default 24 and 1). One timed event
per segment does the work: it runs at the next lead time's instant, sends the warning due then (if
any), and schedules itself at the following one, reading the account's lead times each time, so a
change to them applies to every warning still to come. `since` (when the event was planned) keeps a
warning from being sent twice or late: a lead time whose instant passed before then is not sent.

The policy acts at each warning of the plan's last segment until it has bought: it takes the longest
extension that is free, at most its MaxPrice and (payment mode budget) at most the account's budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from hyperplan.core.extensions import DAILY_UP_TO, WEEKLY_UP_TO
from hyperplan.errors import ValidationError

RECLAIM_WARNING = "reminder.reclaim-warning"
"""The timed event's kind: one pending per segment, payload {"segment": ordinal, "since": ISO time}."""

WARNING_KIND = "reclaim-warning"
POLICY_KIND = "extension-policy"
"""The kinds of the plan events (and webhook deliveries) a warning and a policy attempt write."""

DEFAULT_LEAD_HOURS = (24, 1)
MAX_LEAD_HOURS = 168
MAX_LEADS = 8
PRICED_DAYS = (1, 2, 7)
"""The extension lengths a warning prices (those the fleet has room for)."""
MAX_POLICY_DAYS = WEEKLY_UP_TO
LEAD_FIELD = "ReclaimWarningHours"


def lead_hours(values: object, field: str = LEAD_FIELD) -> tuple[int, ...]:
    """Checked lead times, longest first, each once; a ValidationError names what is wrong."""
    if not isinstance(values, list | tuple):
        raise ValidationError(f"{field} must be a list of whole hours, e.g. [24, 1].")
    if len(values) > MAX_LEADS:
        raise ValidationError(f"{field}: at most {MAX_LEADS} lead times, not {len(values)}.")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LEAD_HOURS:
            raise ValidationError(
                f"{field}: each lead time is a whole number of hours from 1 to {MAX_LEAD_HOURS}, "
                f"not {value!r}."
            )
    return tuple(sorted(set(values), reverse=True))


def reclaim_time(start: datetime, end: datetime, reclaim_lead: timedelta) -> datetime:
    return max(start, end - reclaim_lead)


def first_check(reclaim: datetime, now: datetime) -> datetime | None:
    """When a new segment's warning event first runs: the earliest instant after `now` that any lead
    time (whole hours, at most a week) may ask for; None when none is left (the reclaim is within the
    hour)."""
    hours_left = -(-(reclaim - now) // timedelta(hours=1)) - 1  # the longest lead whose instant is later
    lead = min(MAX_LEAD_HOURS, hours_left)
    return reclaim - timedelta(hours=lead) if lead >= 1 else None


def due_lead(leads: Iterable[int], reclaim: datetime, since: datetime, now: datetime) -> int | None:
    """The lead time whose warning is due now (the shortest, if several fell since `since`), or None."""
    due = [lead for lead in leads if since < reclaim - timedelta(hours=lead) <= now]
    return min(due) if due else None


def next_check(leads: Iterable[int], reclaim: datetime, now: datetime) -> datetime | None:
    """The next lead time's instant after `now`, or None when none is left."""
    later = [reclaim - timedelta(hours=lead) for lead in leads if reclaim - timedelta(hours=lead) > now]
    return min(later) if later else None


# -- what a warning says --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Price:
    days: int
    fee: Decimal
    currency: str


@dataclass(frozen=True)
class Warning:
    plan_name: str
    plan_arn: str
    segment: int
    segment_end: datetime
    reclaim_at: datetime
    lead_hours: int
    jobs: Sequence[tuple[str, str]]  # (name, status)
    groups: Sequence[tuple[str, str, int]]  # (cluster, group, nodes)
    next_start: datetime | None  # the next segment's start; None: the plan's last segment
    prices: Sequence[Price]
    no_extension: str = ""  # why no extension can be priced now (e.g. too close to the end)


def _when(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M} UTC"


def warning_message(w: Warning) -> str:
    parts = [
        f"Segment {w.segment} of plan {w.plan_name} ends at {_when(w.segment_end)}; its capacity is taken "
        f"back at {_when(w.reclaim_at)} (in {w.lead_hours} h)."
    ]
    running = [f"training job {name} ({status})" for name, status in w.jobs]
    running += [f"cluster {cluster} group {group} ({nodes} nodes)" for cluster, group, nodes in w.groups]
    parts.append(f"Running on it: {', '.join(running)}." if running else "Nothing runs on it.")
    if w.next_start is not None:
        parts.append(f"The plan's next segment starts at {_when(w.next_start)}.")
        return " ".join(parts)
    if w.prices:
        shown = ", ".join(f"{_days(p.days)} {p.fee} {p.currency}" for p in w.prices)
        parts.append(f"Extensions free now: {shown}.")
    else:
        parts.append(f"No extension is free now{': ' + w.no_extension if w.no_extension else ''}.")
    parts.append(
        "Search again (offerings are valid 30 minutes): aws sagemaker search-training-plan-offerings "
        f"--training-plan-arn {w.plan_arn} --duration-hours 24, or hyperplan plans extend-search "
        f"{w.plan_name} --days 1."
    )
    return " ".join(parts)


def _days(days: int) -> str:
    return f"{days} day" if days == 1 else f"{days} days"


# -- the extension policy's choice ----------------------------------------------------------------------


def policy_lengths(max_days: int, days_bought: int) -> list[int]:
    """The extension lengths the policy may still buy, longest first (core/extensions.py's steps)."""
    left = max_days - days_bought
    lengths = [d for d in range(1, DAILY_UP_TO + 1)] + list(range(21, WEEKLY_UP_TO + 1, 7))
    return sorted((d for d in lengths if d <= left), reverse=True)


@dataclass(frozen=True)
class Choice:
    """The policy's decision: the extension to buy, or why none."""

    buy: Price | None
    reason: str


def choose(
    free: Sequence[Price], max_price: Decimal | None, budget: Decimal | None, days_left: int
) -> Choice:
    """`free`: the extensions the pool has room for (any order); `budget`: the account's in payment mode
    budget, else None. The longest that fits both limits; else why not, naming the cheapest's price."""
    if days_left <= 0:
        return Choice(None, "the policy has bought its MaxDays already")
    if not free:
        return Choice(None, f"no extension of 1 to {days_left} days is free in the plan's pool")
    fitting = [
        p for p in free if (max_price is None or p.fee <= max_price) and (budget is None or p.fee <= budget)
    ]
    if fitting:
        return Choice(max(fitting, key=lambda p: p.days), "")
    cheapest = min(free, key=lambda p: p.fee)
    price = f"the cheapest, {_days(cheapest.days)}, costs {cheapest.fee} {cheapest.currency}"
    if max_price is not None and cheapest.fee > max_price:
        return Choice(None, f"{price}, over MaxPrice {max_price} {cheapest.currency}")
    return Choice(None, f"{price}, over the account's budget of {budget} {cheapest.currency}")


def bought_message(days: int, fee: Decimal, currency: str, new_end: datetime, how: str) -> str:
    return (
        f"Extension policy: bought {_days(days)} for {fee} {currency}; the plan now ends at "
        f"{_when(new_end)} ({how})."
    )


def not_bought_message(reason: str) -> str:
    return f"Extension policy: nothing bought: {reason}."
