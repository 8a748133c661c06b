"""Administration: invoices to approve or reject, accounts (payment modes, budgets, quotas), the fleet's
pools and how booked they are. Administrators only (the route says so; the services check nothing less
than the native API's administrators' routes)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from hyperplan.console.forms import FieldErrors, Fields
from hyperplan.console.web import ConsoleRequest, Page, Redirect
from hyperplan.core.status import InvoiceStatus
from hyperplan.errors import HyperplanError, ResourceNotFound
from hyperplan.services.accounts.accounts import PAYMENT_MODES
from hyperplan.services.orchestration import account_views, console_views
from hyperplan.services.plans import payments
from hyperplan.services.runtime import fleet

NOTICES = {
    "approved": "Invoice approved.",
    "rejected": "Invoice rejected.",
    "account-updated": "Account updated.",
}


def admin_page(request: ConsoleRequest, **extra: Any) -> Page:
    runtime = request.runtime
    invoices = account_views.list_invoices(runtime, None, None)
    pending = [i for i in invoices if i.status == InvoiceStatus.PENDING]
    settled = [i for i in invoices if i.status != InvoiceStatus.PENDING][-50:]
    now = request.now
    context: dict[str, Any] = {
        "pending": pending,
        "settled": list(reversed(settled)),
        "accounts": account_views.list_accounts(runtime),
        "payment_modes": PAYMENT_MODES,
        "reports": fleet.report(runtime, 56),
        "nodes": console_views.pool_nodes(runtime),
        "now": now,
        "notice": NOTICES.get(request.query.get("notice", ""), ""),
        "errors": {},
        "error_account": "",
    }
    context.update(extra)
    return Page("admin.html", context, status=400 if context["errors"] else 200)


def _invoice_id(request: ConsoleRequest) -> int:
    text = request.path["invoice"]
    if not text.isdigit() or len(text) > 18:
        raise ResourceNotFound(f"There is no invoice {text!r}.")
    return int(text)


def approve(request: ConsoleRequest) -> Redirect:
    account_views.approve_invoice(request.runtime, _invoice_id(request), request.caller)
    return Redirect("/admin?notice=approved")


def reject(request: ConsoleRequest) -> Redirect:
    reason = request.form.get("reason").strip()[:256] or "rejected"
    account_views.reject_invoice(request.runtime, _invoice_id(request), reason, request.caller)
    return Redirect("/admin?notice=rejected")


def update_account(request: ConsoleRequest) -> Page | Redirect:
    account = request.path["account"]
    fields = Fields(request.form)
    mode = fields.text("payment_mode", "Payment mode", required=False, max_length=16) or None
    budget_text = fields.text("budget", "Budget", required=False, max_length=32)
    budget = None
    if budget_text:
        currency = payments.fleet_currency(request.runtime.fleet)
        try:
            budget = Decimal(budget_text)
            places = Decimal(1).scaleb(-payments.currency_places(currency))
            if (
                not budget.is_finite()
                or not 0 <= budget <= payments.MAX_BUDGET
                or budget != budget.quantize(places)
            ):
                raise InvalidOperation
        except InvalidOperation:
            fields.errors["budget"] = (
                f"Budget must be an amount in {currency} from 0 to {payments.MAX_BUDGET}."
            )
    try:
        fields.check()
        account_views.update_account(
            request.runtime,
            account,
            max_plans=None,
            max_instances=None,
            mode=mode,
            budget=budget,
            add_budget=None,
            caller=request.caller,
        )
    except FieldErrors as exc:
        return admin_page(request, errors=exc.errors, error_account=account)
    except HyperplanError as exc:
        return admin_page(request, errors={"payment_mode": exc.message}, error_account=account)
    return Redirect("/admin?notice=account-updated")
