"""Training plans: the list, the search, review and purchase, a plan's page, its extensions, its
automatic extension policy, its lending of idle instances and the return of its capacity (a quote, then
its confirmation); and the capacity at a glance. Every offering and plan shows its pool's cancellation
policy (core/cancellation_words.py).

Handlers translate between forms and the services the API uses (plans, extensions, extension_policy,
lending, returns, plan_views, account_views, console_views); a refusal is shown next to the field it
names, and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

from hyperplan.console.forms import FieldErrors, Fields, place
from hyperplan.console.lengths import OfferingLength, offering_length
from hyperplan.console.timeline import Window
from hyperplan.console.web import ConsoleRequest, Page, Redirect
from hyperplan.core.cancellation_words import policies_for, policy_for, policy_words
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.reclaim_warnings import MAX_POLICY_DAYS
from hyperplan.core.returns import Scope
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import HyperplanError, ValidationError
from hyperplan.services.orchestration import account_views, console_views
from hyperplan.services.orchestration.console_views import OfferingView, PoolTimeline
from hyperplan.services.plans import extension_policy, extensions, lending, plan_views, plans, returns
from hyperplan.services.plans.extension_policy import PolicyView
from hyperplan.services.plans.lending import LendingView
from hyperplan.services.plans.plan_views import PlanView
from hyperplan.wire import model, validate

TARGETS = ("hyperpod-cluster", "training-job")
MAX_INSTANCE_COUNT = 100_000  # what a form takes; the search then says what a pool can hold
SEARCH_FIELDS = {
    "TargetResources": "target",
    "InstanceType": "instance_type",
    "InstanceCount": "instance_count",
    "DurationHours": "duration_days",
    "StartTimeAfter": "start_after",
    "EndTimeBefore": "end_before",
}
NOTICES = {
    "purchased": "Training plan purchased.",
    "extended": "Training plan extended.",
    "policy-set": "Automatic extension policy saved.",
    "policy-cleared": "Automatic extension turned off.",
    "lending-set": "Lending saved: the plan lends its idle instances.",
    "lending-cleared": "Lending stopped: the plan lends nothing.",
    "returned": "Capacity returned: the plan's reserved capacities below are what it keeps; the refund is "
    "credited to the account (or taken off the plan's pending invoice).",
}
# Where a refusal of the extension policy's service is shown: the field whose name its message gives first.
POLICY_FIELDS = {
    "MaxDays": "policy_max_days",
    "Max days": "policy_max_days",
    "max days": "policy_max_days",
    "MaxPrice": "policy_max_price",
    "Max price": "policy_max_price",
    "max price": "policy_max_price",
}
POLICY_PANEL = "#extension-policy"
# The lending form's fields, by the service's names for them (services/plans/lending.FIELD_NAMES), and
# each field's label.
LENDING_FIELDS = {"Notice": "lending_notice", "MinRun": "lending_min_run", "StopMargin": "lending_margin"}
LENDING_LABELS = {"lending_notice": "Notice", "lending_min_run": "Minimum run", "lending_margin": "Margin"}
LENDING_PANEL = "#lending"
# The return form: what can be returned (core/returns.py's scopes, in the words the form shows), and where
# a refusal is shown: the field whose name the service's message gives first.
RETURN_SCOPES = {
    "plan": "The whole plan",
    "segment": "A segment",
    "instances": "Some instances of a segment",
    "tail": "A segment's tail, from a date",
}
RETURN_FIELDS = {
    "Segment": "return_segment",
    "segment": "return_segment",
    "Instances": "return_instances",
    "instances": "return_instances",
    "From": "return_from",
    "boundary": "return_from",
}
RETURN_PANEL = "#returns"


def plans_list(request: ConsoleRequest) -> Page:
    """A page of the account's plans, latest start first; `?page=` is the token of an older page."""
    now = request.now
    token = request.query.get("page", "")
    shown, older = console_views.plans_page(request.runtime, request.caller, token)
    rows = [(plan, console_views.next_transition(plan, now)) for plan in shown]
    return Page("plans.html", {"rows": rows, "now": now, "older": older, "paged": bool(token)})


# -- search, review, purchase ------------------------------------------------------------------------


def _search_page(request: ConsoleRequest, values: dict[str, str], **extra: Any) -> Page:
    fleet = request.runtime.fleet
    context: dict[str, Any] = {
        "values": values,
        "errors": {},
        "offerings": None,
        "targets": TARGETS,
        "instance_types": fleet.reservable_types(),
        "max_days": fleet.policy.max_days,
        "max_count": MAX_INSTANCE_COUNT,
        "boundary": f"{fleet.policy.segment_end:%H:%M}",
        "validity_minutes": int(fleet.policy.offering_validity / timedelta(minutes=1)),
        "timelines": [],
        "window": None,
    }
    context.update(extra)
    return Page("search.html", context, status=400 if context["errors"] else 200)


def search_form(request: ConsoleRequest) -> Page:
    values = {"target": "hyperpod-cluster", "instance_type": "", "instance_count": "", "duration_days": ""}
    values.update({k: v for k, v in request.query.items() if k in SEARCH_FIELDS.values()})
    return _search_page(request, values)


def search(request: ConsoleRequest) -> Page:
    values = request.form.values()
    fields = Fields(request.form)
    target = fields.text("target", "Target", max_length=32)
    instance_type = fields.text("instance_type", "Instance type", max_length=64)
    count = fields.whole("instance_count", "Instance count", 1, MAX_INSTANCE_COUNT)
    days = fields.whole("duration_days", "Duration (days)", 1, request.runtime.fleet.policy.max_days)
    start_after = fields.moment("start_after", "Start after", request.now)
    end_before = fields.moment("end_before", "End before", request.now)
    try:
        fields.check()
        assert count is not None and days is not None
        query = SearchRequest(instance_type, count, days * 24, target, start_after, end_before)
        offerings = console_views.search(request.runtime, request.caller, query)
    except FieldErrors as exc:
        return _search_page(request, values, errors=exc.errors)
    except HyperplanError as exc:
        return _search_page(request, values, errors=place(exc, SEARCH_FIELDS).errors)
    timelines = [t for t in console_views.capacity(request.runtime) if t.pool.instance_type == instance_type]
    return _search_page(
        request,
        values,
        offerings=offerings,
        lengths=[_length(request, offering, timedelta(days=days)) for offering in offerings],
        policies=[_offering_policy(request, offering) for offering in offerings],
        timelines=timelines,
        window=_window(timelines),
        marks=_marks(offerings),
    )


@dataclass(frozen=True)
class Mark:
    """A box drawn over a pool's timeline: an offering's segment, or one of the caller's plans."""

    label: str
    start: datetime
    end: datetime
    title: str
    lane: int = 0  # marks of different offerings or plans are drawn one under another

    @property
    def top(self) -> int:
        return 2 + 13 * (self.lane % 3)


def _marks(offerings: list[OfferingView]) -> dict[tuple[str, str], list[Mark]]:
    """Per pool, the segments of each offering (numbered from 1) that land in it."""
    marks: dict[tuple[str, str], list[Mark]] = {}
    for number, offering in enumerate(offerings, 1):
        for priced in offering.segments:
            s = priced.segment
            title = f"Offering {number}: {s.count} instances"
            marks.setdefault(s.pool_key, []).append(Mark(str(number), s.start, s.end, title, number - 1))
    return marks


def _plan_marks(plans_shown: list[PlanView]) -> dict[tuple[str, str], list[Mark]]:
    """Per pool, the reserved capacities of the caller's plans that still hold it."""
    marks: dict[tuple[str, str], list[Mark]] = {}
    for lane, plan in enumerate(plans_shown):
        for rc in plan.segments:
            if rc.holds_capacity:
                title = f"Your plan {plan.name}: {rc.count} instances, {rc.status}"
                key = (rc.instance_type, rc.availability_zone)
                marks.setdefault(key, []).append(Mark(plan.name, rc.start, rc.end, title, lane))
    return marks


def _length(request: ConsoleRequest, offering: OfferingView, asked: timedelta | None) -> OfferingLength:
    segments = [(s.segment.start, s.segment.end) for s in offering.segments]
    return offering_length(segments, request.runtime.fleet.policy.segment_end, asked)


def _window(timelines: list[PoolTimeline]) -> Window | None:
    return Window(timelines[0].start, timelines[0].end) if timelines else None


def _offering_policy(request: ConsoleRequest, offering: OfferingView) -> str:
    """The words of the cancellation policy a plan bought from this offering would have: its (first
    segment's) pool's, as the native search answers it."""
    return policy_words(policy_for(request.runtime.fleet, offering.segments[0].segment.pool_key))


def _offering_window(offering: OfferingView) -> Window:
    return Window.around([(s.segment.start, s.segment.end) for s in offering.segments])


def review(request: ConsoleRequest) -> Page:
    offering = console_views.read_offering(request.runtime, request.caller, request.form.get("offering_id"))
    return Page("review.html", {**_review_context(request, offering), "values": {}, "errors": {}})


def _review_context(request: ConsoleRequest, offering: OfferingView) -> dict[str, Any]:
    return {
        "offering": offering,
        "window": _offering_window(offering),
        "length": _length(request, offering, None),
        "policy": _offering_policy(request, offering),
    }


def purchase(request: ConsoleRequest) -> Page | Redirect:
    offering_id = request.form.get("offering_id")
    name = request.form.get("plan_name").strip()
    offering = console_views.read_offering(request.runtime, request.caller, offering_id)
    try:
        if not name:
            raise FieldErrors({"plan_name": "Plan name is required."})
        operation = model.operation_model("CreateTrainingPlan")
        validate.parse_request(operation, {"TrainingPlanName": name, "TrainingPlanOfferingId": offering_id})
        plans.create(request.runtime, request.caller, name, offering_id)
    except FieldErrors as exc:
        errors = exc.errors
    except HyperplanError as exc:
        errors = place(exc, {"TrainingPlanName": "plan_name", "Training plan": "plan_name"}).errors
    else:
        return Redirect(f"/plans/{_quoted(name)}?notice=purchased")
    context = {**_review_context(request, offering), "values": {"plan_name": name}}
    return Page("review.html", {**context, "errors": errors}, status=400)


def _quoted(name: str) -> str:
    return quote(name, safe="")


# -- a plan --------------------------------------------------------------------------------------------


def _plan_page(request: ConsoleRequest, **extra: Any) -> Page:
    runtime, caller, name = request.runtime, request.caller, request.path["name"]
    plan = plan_views.describe(runtime, caller, name)
    history = account_views.plan_events(runtime, caller, None, plan.name, start=None)  # the newest page
    _, extended = plan_views.extension_history(runtime, caller, plan.name)
    invoices = [
        invoice
        for invoice in account_views.list_invoices(runtime, caller.account_id, None)
        if invoice.plan_name == plan.name
    ]
    window = Window.around([(s.start, s.end) for s in plan.segments])
    policy = extension_policy.get_policy(runtime, caller, plan.name)
    lent = lending.view(runtime, caller, plan.name)
    spot = runtime.fleet.spot
    cancellation = policies_for(
        runtime.fleet, [(s.instance_type, s.availability_zone) for s in plan.segments]
    )
    context: dict[str, Any] = {
        "plan": plan,
        "events": history.events,
        "earlier_events": history.before,
        "extensions": extended,
        "invoices": invoices,
        "window": window,
        "now_mark": window.place(request.now, request.now + timedelta(minutes=1)),
        "transition": console_views.next_transition(plan, request.now),
        "notice": NOTICES.get(request.query.get("notice", ""), ""),
        "extension_offers": None,
        "max_days": request.runtime.fleet.policy.max_days,
        "values": {},
        "errors": {},
        "policy": policy,
        "policy_values": _policy_values(policy),
        "policy_errors": {},
        "policy_max_days": MAX_POLICY_DAYS,
        "lending": lent,
        "lending_values": _lending_values(lent),
        "lending_errors": {},
        "lending_defaults": {
            "lending_notice": int(spot.notice.total_seconds()),
            "lending_min_run": int(spot.min_run.total_seconds()),
            "lending_margin": int(spot.stop_margin.total_seconds()),
        },
        "lending_max_notice": int(spot.max_notice.total_seconds()),
        "cancellation": [policy_words(policy) for policy in cancellation],
        "returns_allowed": any(policy.allows_returns for policy in cancellation),
        "plan_ended": PlanStatus(plan.status).is_final,
        "return_scopes": RETURN_SCOPES,
        "boundary": f"{runtime.fleet.policy.segment_end:%H:%M}",
        "return_segments": [(_ordinal(s.arn), s) for s in plan.segments if s.holds_capacity],
        "return_values": {"return_scope": "plan"},
        "return_errors": {},
        "quote": None,
    }
    context.update(extra)
    refused = (
        context["errors"] or context["policy_errors"] or context["lending_errors"] or context["return_errors"]
    )
    return Page("plan.html", context, status=400 if refused else 200)


def plan_detail(request: ConsoleRequest) -> Page:
    return _plan_page(request)


def extension_search(request: ConsoleRequest) -> Page:
    fields = Fields(request.form)
    days = fields.whole("extension_days", "Extension (days)", 1, request.runtime.fleet.policy.max_days)
    values = request.form.values()
    try:
        fields.check()
        assert days is not None
        plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
        offers = extensions.search(request.runtime, request.caller, plan.arn, days * 24)
    except FieldErrors as exc:
        return _plan_page(request, values=values, errors=exc.errors)
    except ValidationError as exc:
        return _plan_page(request, values=values, errors={"extension_days": exc.message})
    return _plan_page(request, values=values, extension_offers=offers)


def extend(request: ConsoleRequest) -> Page | Redirect:
    plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
    try:
        extensions.extend(request.runtime, request.caller, request.form.get("offering_id"))
    except HyperplanError as exc:
        return _plan_page(request, errors={"extension_days": exc.message})
    return Redirect(f"/plans/{_quoted(plan.name)}?notice=extended")


# -- a plan's automatic extension policy ---------------------------------------------------------------


def set_extension_policy(request: ConsoleRequest) -> Page | Redirect:
    """Save the policy from the panel's form, then back to the plan's page (post-redirect-get). The form
    checks only that its fields are numbers; their bounds are the service's (as for the API and the CLI),
    whose refusal is shown next to the field it names, with what was typed. The plan is looked up first,
    so that another account's is a 404 page like any other."""
    plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
    values = request.form.values()
    fields = Fields(request.form)
    max_days = _policy_days(fields)
    max_price = _policy_price(fields)
    try:
        fields.check()
        assert max_days is not None
        extension_policy.set_policy(request.runtime, request.caller, plan.name, max_days, max_price)
    except FieldErrors as exc:
        return _plan_page(request, policy_values=values, policy_errors=exc.errors)
    except HyperplanError as exc:
        return _plan_page(request, policy_values=values, policy_errors=place(exc, POLICY_FIELDS).errors)
    return Redirect(f"/plans/{_quoted(plan.name)}?notice=policy-set{POLICY_PANEL}")


def clear_extension_policy(request: ConsoleRequest) -> Page | Redirect:
    plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
    try:
        extension_policy.clear_policy(request.runtime, request.caller, plan.name)
    except HyperplanError as exc:
        return _plan_page(request, policy_errors={"": exc.message})
    return Redirect(f"/plans/{_quoted(plan.name)}?notice=policy-cleared{POLICY_PANEL}")


def _policy_values(policy: PolicyView | None) -> dict[str, str]:
    """The form shows the policy in force, to be changed rather than typed again."""
    if policy is None:
        return {}
    price = "" if policy.max_price is None else str(policy.max_price)
    return {"policy_max_days": str(policy.max_days), "policy_max_price": price}


def _policy_days(fields: Fields) -> int | None:
    """A whole number, any: 0 or 400 is the service's to refuse, in its own words."""
    text = fields.text("policy_max_days", "Max days", max_length=16)
    if text and not text.isdigit():
        fields.errors["policy_max_days"] = "Max days must be a whole number of days."
    return int(text) if text.isdigit() else None


def _policy_price(fields: Fields) -> Decimal | None:
    """An amount, or None when left blank (no price limit: the account's budget still bounds it)."""
    text = fields.text("policy_max_price", "Max price", required=False, max_length=32)
    if not text:
        return None
    try:
        amount = Decimal(text)
        if not amount.is_finite():  # NaN and Infinity parse, but are no price
            raise InvalidOperation
    except InvalidOperation:
        fields.errors["policy_max_price"] = "Max price must be an amount, such as 12000 or 12000.50."
        return None
    return amount


# -- a plan's lending of its idle instances -------------------------------------------------------------


def set_lending(request: ConsoleRequest) -> Page | Redirect:
    """Lend the plan's idle instances on the form's terms (each left blank: the fleet's default), then back
    to the plan's page. The form checks only that each is a number of seconds; the bounds are the
    service's, whose refusal is shown next to the field it names. Another account's plan is a 404 page."""
    plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
    values = request.form.values()
    fields = Fields(request.form)
    seconds = {field: _lending_seconds(fields, field) for field in LENDING_LABELS}
    try:
        fields.check()
        lending.set_policy(
            request.runtime,
            request.caller,
            plan.name,
            notice=seconds["lending_notice"],
            min_run=seconds["lending_min_run"],
            stop_margin=seconds["lending_margin"],
        )
    except FieldErrors as exc:
        return _plan_page(request, lending_values=values, lending_errors=exc.errors)
    except HyperplanError as exc:
        return _plan_page(request, lending_values=values, lending_errors=place(exc, LENDING_FIELDS).errors)
    return Redirect(f"/plans/{_quoted(plan.name)}?notice=lending-set{LENDING_PANEL}")


def clear_lending(request: ConsoleRequest) -> Page | Redirect:
    plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
    try:
        lending.clear_policy(request.runtime, request.caller, plan.name)
    except HyperplanError as exc:
        return _plan_page(request, lending_errors={"": exc.message})
    return Redirect(f"/plans/{_quoted(plan.name)}?notice=lending-cleared{LENDING_PANEL}")


def _lending_values(view: LendingView) -> dict[str, str]:
    """The form shows the terms in force, to be changed rather than typed again; blank when none."""
    if view.mode != lending.IDLE:
        return {}
    return {
        "lending_notice": str(view.notice_seconds),
        "lending_min_run": str(view.min_run_seconds),
        "lending_margin": str(view.stop_margin_seconds),
    }


def _lending_seconds(fields: Fields, name: str) -> int | None:
    """Whole seconds, or None when blank (the fleet's default); any size: bounds are the service's."""
    label = LENDING_LABELS[name]
    text = fields.text(name, label, required=False, max_length=16)
    if text and not (text.isascii() and text.isdigit()):
        fields.errors[name] = f"{label} must be a whole number of seconds."
        return None
    return int(text) if text else None


# -- returning a plan's capacity -------------------------------------------------------------------------


def quote_return(request: ConsoleRequest) -> Page:
    """Ask what returning the form's scope would give back and refund; the plan's page shows the quote
    with a button that carries it out (valid for the policy's few minutes of service time). The form
    checks only the shape of its fields; what may be returned is the service's to say, next to the field
    its message names. Another account's plan is a 404 page, as everywhere."""
    plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
    values = request.form.values()
    fields = Fields(request.form)
    scope = _return_scope(fields, request.now)
    try:
        fields.check()
        assert scope is not None
        quoted = returns.quote(request.runtime, request.caller, plan.name, scope)
    except FieldErrors as exc:
        return _plan_page(request, return_values=values, return_errors=exc.errors)
    except HyperplanError as exc:
        return _plan_page(request, return_values=values, return_errors=place(exc, RETURN_FIELDS).errors)
    return _plan_page(request, return_values=values, quote=quoted, quote_policy=policy_words(quoted.policy))


def carry_out_return(request: ConsoleRequest) -> Page | Redirect:
    """Carry out the quote the confirm button holds, then back to the plan's page (post-redirect-get);
    a quote that expired, was used, or whose plan changed since is refused with the service's words."""
    plan = plan_views.describe(request.runtime, request.caller, request.path["name"])
    try:
        returns.carry_out(request.runtime, request.caller, request.form.get("quote_id"))
    except HyperplanError as exc:
        return _plan_page(request, return_errors={"": exc.message})
    return Redirect(f"/plans/{_quoted(plan.name)}?notice=returned{RETURN_PANEL}")


def _return_scope(fields: Fields, now: datetime) -> Scope | None:
    """The form's scope: its kind, and the segment, count or date the kind needs (others are ignored)."""
    kind = fields.text("return_scope", "What to return", max_length=16)
    if kind not in RETURN_SCOPES:
        fields.errors["return_scope"] = "Choose what to return: " + ", ".join(RETURN_SCOPES) + "."
        return None
    if kind == "plan":
        return Scope("plan")
    ordinal = _form_number(fields, "return_segment", "Segment")
    instances = _form_number(fields, "return_instances", "Instances") if kind == "instances" else None
    start = fields.moment("return_from", "From", now) if kind == "tail" else None
    return Scope(kind, ordinal=ordinal, instances=instances, start=start)


def _form_number(fields: Fields, name: str, label: str) -> int | None:
    """A whole number of at least 1; its bounds (a segment the plan has, a count it may leave) are the
    service's."""
    text = fields.text(name, label, max_length=16)
    if text and not (text.isascii() and text.isdigit() and int(text) >= 1):
        fields.errors[name] = f"{label} must be a whole number of at least 1."
    return int(text) if text.isascii() and text.isdigit() else None


def _ordinal(arn: str) -> int:
    """A reserved capacity's number in its plan, from its ARN (reserved-capacity/PLAN-rcN)."""
    return int(arn.rsplit("-rc", 1)[1])


# -- capacity --------------------------------------------------------------------------------------------


def capacity(request: ConsoleRequest) -> Page:
    timelines = console_views.capacity(request.runtime)
    wanted = request.query.get("instance_type", "")
    count_text = request.query.get("instance_count", "")
    count = int(count_text) if count_text.isdigit() and 0 < int(count_text) <= MAX_INSTANCE_COUNT else None
    errors = {}
    if count_text and count is None:
        errors["instance_count"] = f"Instance count must be a whole number from 1 to {MAX_INSTANCE_COUNT}."
    shown = [t for t in timelines if not wanted or t.pool.instance_type == wanted]
    own = _plan_marks(console_views.live_plans(request.runtime, request.caller))
    return Page(
        "capacity.html",
        {
            "timelines": [t for t in shown if t.pool.reservable > 0],
            "window": _window(timelines),
            "instance_types": request.runtime.fleet.reservable_types(),
            "values": {"instance_type": wanted, "instance_count": count_text},
            "count": count,
            "max_count": MAX_INSTANCE_COUNT,
            "marks": own,
            "errors": errors,
            "now": request.now,
        },
        status=400 if errors else 200,
    )
