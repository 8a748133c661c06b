"""The Usage page: the monthly books (services/plans/usage.py, `monthly_usage`), as `hyperplan usage
--monthly` shows them: the signed-in account's months, every account's for an administrator. A read
only page: the same service and the same scoping as GET /api/v1/usage/monthly."""

from __future__ import annotations

from hyperplan.console.web import ConsoleRequest, Page
from hyperplan.services.plans import usage
from hyperplan.services.plans.payments import fleet_currency


def usage_page(request: ConsoleRequest) -> Page:
    months = usage.monthly_usage(request.runtime, request.caller, account_ref=None, start=None, end=None)
    context = {
        "months": months,
        "currency": fleet_currency(request.runtime.fleet),
        "every_account": request.caller.is_admin,
    }
    return Page("usage.html", context)
