"""Views of accounts, access keys and ledgers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from hyperplan.cli.views.base import TableView


@dataclass(frozen=True)
class NewKey:
    """A new access key with its secret, which the server shows only this once."""

    key: dict[str, Any]

    def __rich__(self) -> Group:
        key = self.key
        return Group(
            Text.assemble("Account ", (key["AccountName"], "bold"), f" ({key['AccountId']})"),
            Text(f"  aws_access_key_id = {key['AccessKeyId']}"),
            Text(f"  aws_secret_access_key = {key['SecretAccessKey']}"),
            Text("The secret is shown once; keep it now.", style="dim"),
        )


@dataclass(frozen=True)
class AccountsTable:
    accounts: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                account["Name"],
                account["AccountId"],
                "yes" if account["Admin"] else "",
                account["PaymentMode"],
                account["Budget"],
                _os_user(account),
                _keys(account["AccessKeys"]),
            ]
            for account in self.accounts
        ]
        return TableView(
            "Accounts", ["Name", "Account id", "Admin", "Payment", "Budget", "OS user", "Access keys"], rows
        )


def _os_user(account: dict[str, Any]) -> str:
    user = account.get("OsUser") or ""
    uid = account.get("OsUid")
    return f"{user} ({uid})" if user and uid is not None else user


@dataclass(frozen=True)
class AccountDeleted:
    result: dict[str, Any]

    def __rich__(self) -> Text:
        r = self.result
        user = f"; its OS user was {r['OsUser']}" if r.get("OsUser") else ""
        return Text(f"Deleted account {r['Name']} ({r['AccountId']}): its keys are revoked{user}.")


def _keys(keys: list[dict[str, Any]]) -> str:
    """The key ids not deleted (an inactive one marked), and how many were deleted."""
    live = [
        k["AccessKeyId"] + (" (inactive)" if k.get("Status", "Active") != "Active" else "")
        for k in keys
        if not k["RevokedAt"]
    ]
    revoked = sum(1 for k in keys if k["RevokedAt"])
    return ", ".join(live) + (f" (+{revoked} revoked)" if revoked else "")


@dataclass(frozen=True)
class AccountSettings:
    """An account's payment mode, money and quotas on one line; its own rate limits on a second."""

    account: dict[str, Any]

    def __rich__(self) -> Text:
        a = self.account
        text = Text(
            f"{a['Name']}: payment mode {a['PaymentMode']}, budget {a['Budget']}, spend {a['Spend']}; "
            f"quotas: {a['Quotas']['MaxActivePlans']} plans, "
            f"{a['Quotas']['MaxReservedInstancesPerType']} instances per type"
        )
        share, hours = (
            a["Quotas"].get("MaxReservedSharePerType"),
            a["Quotas"].get("MaxReservedInstanceHoursPer30Days"),
        )
        if share is not None:
            text.append(f" (at most {share:.0%} of a type's reservable instances)")
        if hours is not None:
            text.append(f", {hours:,} instance-hours in any 30 days")
        on_demand, on_demand_share = (
            a["Quotas"].get("MaxOnDemandInstancesPerType"),
            a["Quotas"].get("MaxOnDemandSharePerType"),
        )
        parts = [f"{on_demand} instances per type"] if on_demand is not None else []
        if on_demand_share is not None:
            parts.append(f"at most {on_demand_share:.0%} of a type's on-demand instances")
        if parts:
            text.append(f"; on-demand: {', '.join(parts)}")
        own = {k: v for k, v in (a.get("RateLimits") or {}).items() if v.get("Set") == "account"}
        if own:
            limits = ", ".join(f"{k} {v['Rate']:g}/s burst {v['Burst']}" for k, v in sorted(own.items()))
            text.append(f"\nrate limits of its own: {limits}; the fleet's for the rest")
        return text


@dataclass(frozen=True)
class LedgerTable:
    account: str
    entries: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [e["At"], e["Amount"], e["BudgetAfter"], e["InvoiceId"] or "", e["Description"]]
            for e in self.entries
        ]
        return TableView(
            f"Ledger of {self.account}", ["At", "Amount", "Budget after", "Invoice", "Description"], rows
        )


@dataclass(frozen=True)
class KeyRevoked:
    access_key_id: str

    def __rich__(self) -> Text:
        return Text(f"Revoked {self.access_key_id}.")


@dataclass(frozen=True)
class MasterKeyRotated:
    answer: dict[str, int]

    def __rich__(self) -> Text:
        return Text(
            f"Rotated the master key: {self.answer['AccessKeysResealed']} access-key secrets, "
            f"{self.answer['WebhooksResealed']} webhook secrets and "
            f"{self.answer.get('RegistryCredentialsResealed', 0)} registry passwords sealed under the new "
            "key. "
            "Back up the key file again: the old one opens nothing now."
        )
