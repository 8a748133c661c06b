"""The rules of extending a plan (AWS: training-plan extensions), as pure functions.

An extension adds whole days at the plan's current end, in the same pool with the same count. It may
be requested while the plan is Active or Scheduled, with no other extension awaiting payment, from 57
days up to 1 hour before the plan ends. Lengths go in 1-day steps up to 14 days, then in 7-day steps up
to 182 days.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hyperplan.core.lifecycle import PlanStatus
from hyperplan.errors import ValidationError

EARLIEST = timedelta(days=57)  # before the plan's end
LATEST = timedelta(hours=1)  # before the plan's end
DAILY_UP_TO = 14
WEEKLY_UP_TO = 182


def extension_days(duration_hours: int) -> int:
    """Whole days for a requested DurationHours, or a ValidationError that names the step rule."""
    days = -(-duration_hours // 24)
    if days > WEEKLY_UP_TO:
        raise ValidationError(
            f"DurationHours: an extension is at most {WEEKLY_UP_TO} days ({WEEKLY_UP_TO * 24} h)."
        )
    if days > DAILY_UP_TO and days % 7:
        lower, upper = days - days % 7, days + 7 - days % 7
        raise ValidationError(
            f"DurationHours: extensions longer than {DAILY_UP_TO} days come in 7-day steps; "
            f"{duration_hours} h is {days} days: ask for {lower * 24} h or {upper * 24} h."
        )
    return days


def check_extendable(status: str, plan_end: datetime, now: datetime, payment_pending: bool) -> None:
    """Refuse, naming the rule, an extension the plan's state or timing does not allow."""
    if PlanStatus(status) not in (PlanStatus.ACTIVE, PlanStatus.SCHEDULED):
        raise ValidationError(
            f"TrainingPlanArn: only an Active or Scheduled plan can be extended; this one is {status}."
        )
    if payment_pending:
        raise ValidationError(
            "TrainingPlanArn: the plan has an extension awaiting payment; settle it before extending again."
        )
    if plan_end - now > EARLIEST:
        raise ValidationError(
            f"TrainingPlanArn: extensions can be bought from 57 days before the plan ends "
            f"({plan_end - EARLIEST:%Y-%m-%d %H:%M} UTC for this plan)."
        )
    if plan_end - now < LATEST:
        raise ValidationError(
            f"TrainingPlanArn: extensions must be bought at least 1 hour before the plan ends "
            f"({plan_end:%Y-%m-%d %H:%M} UTC for this plan)."
        )
