"""The console's Usage page (issue 53, "the books"), over HTTP against an in-process server: the header
links to it on every page; it shows the monthly books of the signed-in account (GET
/api/v1/usage/monthly's rows, the same figures), and every account's to an administrator, never another
account's to anyone else."""

from __future__ import annotations

import html
import re
from decimal import Decimal

from tests.console.test_console import Console
from tests.harness import ADMIN
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"


def _rows(page: str) -> list[list[str]]:
    """The usage table's body rows, each cell's text."""
    body = re.search(r'<table class="usage">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert body, page
    rows = re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)
    return [
        [html.unescape(cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in rows
    ]


def test_the_usage_page_shows_the_accounts_own_months_and_every_account_to_an_administrator(
    fast_shared_server: InProcessServer,
) -> None:
    server = fast_shared_server
    buyer, other = server.new_account("usage-buyer"), server.new_account("usage-other")
    client = server.sagemaker(buyer)
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName="books", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    fee = Decimal(client.describe_training_plan(TrainingPlanName="books")["UpfrontFee"])
    [month] = server.native(buyer).get("/api/v1/usage/monthly")["Months"]
    assert Decimal(month["Paid"]) == fee  # paid at purchase (the account pays when invoiced)

    console = Console(server)
    assert console.sign_in(buyer).status_code == 303
    plans_page = console.get("/console/plans").text
    assert 'href="/console/usage">Usage</a>' in plans_page  # in the header, beside the other pages
    page = console.get("/console/usage")
    assert page.status_code == 200
    money = f"{fee:,.2f} USD"
    assert _rows(page.text) == [
        ["usage-buyer", month["Month"], "0", "0", "0", "0", "0", money, "0.00 USD", "0.00 USD", money]
    ]

    # Another account sees its own books (none), and nothing of the buyer's.
    stranger = Console(server)
    assert stranger.sign_in(other).status_code == 303
    theirs = stranger.get("/console/usage").text
    assert "Nothing reserved, used or paid" in theirs and "usage-buyer" not in theirs

    # An administrator sees every account's months.
    admin = Console(server)
    assert admin.sign_in(ADMIN).status_code == 303
    every = _rows(admin.get("/console/usage").text)
    assert [
        "usage-buyer",
        month["Month"],
        "0",
        "0",
        "0",
        "0",
        "0",
        money,
        "0.00 USD",
        "0.00 USD",
        money,
    ] in every
    assert "usage-other" not in {row[0] for row in every}  # an account with nothing has no row
