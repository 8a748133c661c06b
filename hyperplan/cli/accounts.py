"""`hyperplan accounts`: administrators manage accounts and their access keys."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hyperplan.cli.common import (
    console,
    emit,
    json_output,
    native_client,
    print_table,
    reporting_errors,
)
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Accounts and access keys (administrators).", no_args_is_help=True)


def _show_key(key: dict[str, Any]) -> None:
    console.print(f"Account [bold]{key['AccountName']}[/bold] ({key['AccountId']})")
    console.print(f"  aws_access_key_id = {key['AccessKeyId']}")
    console.print(f"  aws_secret_access_key = {key['SecretAccessKey']}")
    console.print("[dim]The secret is shown once; keep it now.[/dim]")


@app.command("create")
def create(
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="Make it an administrator.")] = False,
    payment_mode: Annotated[str | None, typer.Option(help="auto, budget or approval.")] = None,
) -> None:
    """Create an account and print its id and first access key."""
    body: dict[str, Any] = {"Name": name, "Admin": admin}
    if payment_mode:
        body["PaymentMode"] = payment_mode
    with reporting_errors():
        key = native_client().post("/api/v1/accounts", body)
    emit(
        {k: key[k] for k in ("AccountId", "AccessKeyId", "SecretAccessKey")} if json_output() else key,
        _show_key,
    )


@app.command("list")
def list_accounts() -> None:
    """List accounts with their keys."""
    with reporting_errors():
        result = native_client().get("/api/v1/accounts")

    def render(value: dict[str, Any]) -> None:
        rows = []
        for account in value["Accounts"]:
            active = [k["AccessKeyId"] for k in account["AccessKeys"] if not k["RevokedAt"]]
            revoked = sum(1 for k in account["AccessKeys"] if k["RevokedAt"])
            keys = ", ".join(active) + (f" (+{revoked} revoked)" if revoked else "")
            rows.append(
                [
                    account["Name"],
                    account["AccountId"],
                    "yes" if account["Admin"] else "",
                    account["PaymentMode"],
                    account["Budget"],
                    keys,
                ]
            )
        print_table("Accounts", ["Name", "Account id", "Admin", "Payment", "Budget", "Access keys"], rows)

    emit(result["Accounts"] if json_output() else result, render)


@app.command("add-key")
def add_key(
    account: Annotated[str, typer.Argument(help="Account name or id.")],
) -> None:
    """Add an access key to an account."""
    with reporting_errors():
        key = native_client().post(f"/api/v1/accounts/{account}/keys")
    emit(key, _show_key)


@app.command("revoke-key")
def revoke_key(
    access_key_id: str,
) -> None:
    """Revoke an access key: its next request is refused."""
    with reporting_errors():
        result = native_client().delete(f"/api/v1/keys/{access_key_id}")
    emit(result, lambda _: console.print(f"Revoked {access_key_id}."))


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
) -> None:
    """Set an account's payment mode, budget and quotas (administrators)."""
    body: dict[str, Any] = {
        k: v for k, v in (("PaymentMode", payment_mode), ("Budget", budget), ("AddBudget", add_budget)) if v
    }
    quota_options = (("MaxActivePlans", max_plans), ("MaxReservedInstancesPerType", max_instances))
    limits = {k: v for k, v in quota_options if v}
    if limits:
        body["Quotas"] = limits
    with reporting_errors():
        result = native_client().call("PATCH", f"/api/v1/accounts/{account}", body=body)
    emit(
        result,
        lambda a: console.print(
            f"{a['Name']}: payment mode {a['PaymentMode']}, budget {a['Budget']}, spend {a['Spend']}; "
            f"quotas: {a['Quotas']['MaxActivePlans']} plans, "
            f"{a['Quotas']['MaxReservedInstancesPerType']} instances per type"
        ),
    )


@app.command("ledger")
def ledger(
    account: Annotated[str, typer.Argument(help="Account name or id.")],
) -> None:
    """Every movement of an account's money."""
    with reporting_errors():
        result = native_client().get(f"/api/v1/accounts/{account}/ledger")

    def render(value: dict[str, Any]) -> None:
        rows = [
            [e["At"], e["Amount"], e["BudgetAfter"], e["InvoiceId"] or "", e["Description"]]
            for e in value["Entries"]
        ]
        print_table(f"Ledger of {account}", ["At", "Amount", "Budget after", "Invoice", "Description"], rows)

    emit(result, render)
