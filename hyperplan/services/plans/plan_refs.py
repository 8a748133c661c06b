"""A plan named in a request: by its name (the caller's own) or by its ARN (an administrator may name
any account's). Another account's plan is not found, as if it did not exist: accounts never learn of
each other's plans."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.errors import ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingPlan


def plan_named(session: Session, runtime: ServiceContext, caller: Caller, ref: str) -> TrainingPlan:
    """The plan `ref` names for `caller`; ResourceNotFound for any plan the caller may not see."""
    account_id, name = caller.account_id, ref
    if ref.startswith("arn:"):
        prefix = f"arn:aws:sagemaker:{runtime.region}:"
        account_id, _, resource = ref.removeprefix(prefix).partition(":")
        kind, _, name = resource.partition("/")
        theirs = account_id != caller.account_id and not caller.is_admin
        if not ref.startswith(prefix) or kind != "training-plan" or theirs:
            name = ""
    plan = None
    if name:
        plan = session.scalar(
            select(TrainingPlan).where(TrainingPlan.account_id == account_id, TrainingPlan.name == name)
        )
    if plan is None:
        raise ResourceNotFound(f"Training plan {ref} does not exist.")
    return plan
