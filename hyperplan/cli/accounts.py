"""`hyperplan accounts`: administrators manage accounts and their access keys."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hyperplan.cli.common import emit, json_output, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Accounts and access keys (administrators).", no_args_is_help=True)


@app.command("create")
def create(
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="Make it an administrator.")] = False,
    payment_mode: Annotated[str | None, typer.Option(help="auto, budget or approval.")] = None,
    os_user: Annotated[
        str | None,
        typer.Option(
            help="An existing OS user the account's work runs as (not root, not the server's user); "
            "default: hp-ACCOUNT_ID, made by the server in isolation mode users."
        ),
    ] = None,
) -> None:
    """Create an account and print its id and first access key."""
    from hyperplan.cli.views.accounts import NewKey

    body: dict[str, Any] = {"Name": name, "Admin": admin}
    if payment_mode:
        body["PaymentMode"] = payment_mode
    if os_user:
        body["OsUser"] = os_user
    with reporting_errors():
        key = native_client().post("/api/v1/accounts", body)
    emit(
        {k: key[k] for k in ("AccountId", "AccessKeyId", "SecretAccessKey")} if json_output() else key,
        NewKey,
    )


@app.command("list")
def list_accounts() -> None:
    """List accounts with their keys."""
    from hyperplan.cli.views.accounts import AccountsTable

    with reporting_errors():
        result = native_client().get("/api/v1/accounts")
    emit(result["Accounts"], AccountsTable)


@app.command("delete")
def delete(account: Annotated[str, typer.Argument(help="Account name or id.")]) -> None:
    """Delete an account that has no plan, cluster or training job still open (administrators).

    Its keys are revoked and the OS user the server made for it is removed; its invoices and ledger
    stay."""
    from hyperplan.cli.views.accounts import AccountDeleted

    with reporting_errors():
        result = native_client().delete(f"/api/v1/accounts/{account}")
    emit(result, AccountDeleted)


@app.command("add-key")
def add_key(account: Annotated[str, typer.Argument(help="Account name or id.")]) -> None:
    """Add an access key to an account."""
    from hyperplan.cli.views.accounts import NewKey

    with reporting_errors():
        key = native_client().post(f"/api/v1/accounts/{account}/keys")
    emit(key, NewKey)


@app.command("revoke-key")
def revoke_key(access_key_id: str) -> None:
    """Revoke an access key: its next request is refused."""
    from hyperplan.cli.views.accounts import KeyRevoked

    with reporting_errors():
        result = native_client().delete(f"/api/v1/keys/{access_key_id}")
    emit(result, lambda _: KeyRevoked(access_key_id))


@app.command("rotate-master-key")
def rotate_master_key() -> None:
    """Seal every stored secret under a new master key, in one transaction (administrators).

    Every access key and webhook keeps working; the server's key file holds the new key afterwards."""
    from hyperplan.cli.views.accounts import MasterKeyRotated

    with reporting_errors():
        result = native_client().post("/api/v1/master-key/rotate")
    emit(result, MasterKeyRotated)


@app.command("update")
def update(
    account: Annotated[str, typer.Argument(help="Account name or id.")],
    payment_mode: Annotated[str | None, typer.Option(help="auto, budget or approval.")] = None,
    budget: Annotated[str | None, typer.Option(help="Set the budget to this amount, e.g. 250000.00.")] = None,
    add_budget: Annotated[str | None, typer.Option(help="Add this amount to the budget.")] = None,
    max_plans: Annotated[int | None, typer.Option(help="Quota: plans not yet Expired or Failed.")] = None,
    max_instances: Annotated[
        int | None, typer.Option(help="Quota: reserved instances of one type at any instant.")
    ] = None,
    max_instance_hours: Annotated[
        int | None, typer.Option(help="Quota: reserved instance-hours, all types, in any 30 days.")
    ] = None,
    max_on_demand_instances: Annotated[
        int | None, typer.Option(help="Quota: on-demand instances of one type at any instant.")
    ] = None,
    rate_limit: Annotated[
        list[str] | None,
        typer.Option(
            help="CLASS=RATE/BURST (search, purchase, read, write; requests per second / at once), "
            "or CLASS=default for the fleet's. Repeat for several classes."
        ),
    ] = None,
    reclaim_warning_hours: Annotated[
        str | None,
        typer.Option(help='Hours before each segment\'s reclaim to warn at, e.g. 24,1 ("" for none).'),
    ] = None,
) -> None:
    """Set an account's payment mode, budget, quotas, rate limits and reclaim warnings (administrators)."""
    from hyperplan.cli.views.accounts import AccountSettings

    body: dict[str, Any] = {
        k: v
        for k, v in (("PaymentMode", payment_mode), ("Budget", budget), ("AddBudget", add_budget))
        if v is not None
    }
    quota_options = (
        ("MaxActivePlans", max_plans),
        ("MaxReservedInstancesPerType", max_instances),
        ("MaxReservedInstanceHoursPer30Days", max_instance_hours),
        ("MaxOnDemandInstancesPerType", max_on_demand_instances),
    )
    limits = {k: v for k, v in quota_options if v is not None}  # 0 goes to the server, which names the range
    if limits:
        body["Quotas"] = limits
    if rate_limit:
        body["RateLimits"] = dict(_rate_limit(given) for given in rate_limit)
    if reclaim_warning_hours is not None:
        body["ReclaimWarningHours"] = _hours(reclaim_warning_hours)
    with reporting_errors():
        result = native_client().call("PATCH", f"/api/v1/accounts/{account}", body=body)
    emit(result, AccountSettings)


def _hours(given: str) -> list[Any]:
    """``24,1`` -> [24, 1]; what is not a whole number goes to the server as given, which names it."""
    parts = [part.strip() for part in given.split(",") if part.strip()]
    return [int(part) if part.isdigit() else part for part in parts]


def _rate_limit(given: str) -> tuple[str, dict[str, Any] | None]:
    """``search=2/10`` -> ("search", {"Rate": 2, "Burst": 10}); ``search=default`` -> ("search", None).
    Only the form is checked here; the server checks the class and the numbers, and names what is wrong."""
    name, _, value = given.partition("=")
    if value == "default":
        return name, None
    rate, slash, burst = value.partition("/")
    try:
        if not slash:
            raise ValueError
        number = float(rate)
        return name, {"Rate": int(number) if number.is_integer() else number, "Burst": int(burst)}
    except ValueError:
        raise typer.BadParameter(
            f"{given!r}: give CLASS=RATE/BURST, e.g. search=2/10, or CLASS=default", param_hint="--rate-limit"
        ) from None


@app.command("ledger")
def ledger(account: Annotated[str, typer.Argument(help="Account name or id.")]) -> None:
    """Every movement of an account's money."""
    from hyperplan.cli.views.accounts import LedgerTable

    with reporting_errors():
        result = native_client().get(f"/api/v1/accounts/{account}/ledger")
    emit(result, lambda r: LedgerTable(account, r["Entries"]))
