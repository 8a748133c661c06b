"""The console's defects of issue 47, each shown in a real headless Chromium where a user saw it.

One in-process server and one browser, signed in once, serve every test of the module (the browser part
has a small budget). The account holds a one-day plan with a long hyphenated name, bought with boto3.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from hyperplan.signing import Credentials
from tests.console.browser import browser_page, sign_in
from tests.inprocess import InProcessServer

pytestmark = pytest.mark.browser  # a part of its own (tests/parts.py)

P5 = "ml.p5.48xlarge"
LONG_NAME = "one-day-plan-with-a-long-hyphenated-name"
PAGES = (
    "/plans",
    f"/plans/{LONG_NAME}",
    "/offerings",
    "/capacity",
    "/clusters",
    "/new-cluster",
    "/training-jobs",
)


@pytest.fixture(scope="module")
def team(fast_shared_server: InProcessServer) -> Credentials:
    credentials = fast_shared_server.new_account("console-defects")
    client = fast_shared_server.sagemaker(credentials)
    offerings = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["hyperpod-cluster"]
    )["TrainingPlanOfferings"]
    shortest = min(offerings, key=lambda o: (o["DurationHours"], o.get("DurationMinutes", 0)))
    client.create_training_plan(
        TrainingPlanName=LONG_NAME, TrainingPlanOfferingId=shortest["TrainingPlanOfferingId"]
    )
    return credentials


@pytest.fixture(scope="module")
def page(fast_shared_server: InProcessServer, team: Credentials) -> Iterator[Any]:
    with browser_page() as page:
        sign_in(page, fast_shared_server.url, team)
        yield page


def _open(page: Any, server: InProcessServer, path: str) -> None:
    page.goto(f"{server.url}/console{path}")


def test_the_browser_refuses_numbers_out_of_range_and_names_too_long(
    page: Any, fast_shared_server: InProcessServer
) -> None:
    _open(page, fast_shared_server, "/offerings")
    count, days = page.get_by_label("Instance count"), page.get_by_label("Duration (days)")
    page.get_by_label("Instance type").select_option(P5)
    count.fill("0")
    days.fill("3")
    page.get_by_role("button", name="Search").click()
    assert count.evaluate("input => input.validity.rangeUnderflow")
    assert count.evaluate("input => input.validationMessage")  # what the browser tells the user
    assert page.get_by_role("heading", name="Offerings", exact=True).count() == 0  # the form was not sent
    count.fill("1")
    days.fill("100000")
    assert days.evaluate("input => input.validity.rangeOverflow")
    assert not days.evaluate("input => input.form.checkValidity()")

    _open(page, fast_shared_server, "/capacity")
    assert page.get_by_label("Instance count").evaluate("input => input.min") == "1"

    _open(page, fast_shared_server, "/new-cluster")
    name = page.get_by_label("Cluster name")
    name.press_sequentially("c" * 70)  # typed: the browser stops at the limit
    assert name.input_value() == "c" * 63
    name.fill("")
    page.get_by_role("button", name="Create cluster").click()
    assert name.evaluate("input => input.validity.valueMissing")
    assert page.get_by_role("heading", name="Create a cluster").count() == 1


DAY_TITLE = re.compile(r": (\d+) reserved, (\d+) free$")


def _reserved_and_free(title: str) -> tuple[int, int]:
    found = DAY_TITLE.search(title)
    assert found, title
    return int(found.group(1)), int(found.group(2))


def test_the_days_with_enough_free_are_highlighted_on_top_of_the_reserved_bar(
    page: Any, fast_shared_server: InProcessServer
) -> None:
    _open(page, fast_shared_server, f"/capacity?instance_type={P5}&instance_count=20")
    page.get_by_text("days with at least 20 free").wait_for()
    row = page.locator(".timeline.capacity").first
    row.scroll_into_view_if_needed()
    # For each day: how much is reserved and free (its title), and what is on top at its bottom edge,
    # where the highlight is drawn and where the reserved bar starts.
    days = row.evaluate(
        """timeline => [...timeline.querySelectorAll('.day')].map(day => {
            const box = day.getBoundingClientRect();
            const top = document.elementFromPoint(box.left + box.width / 2, box.bottom - 2);
            return {title: day.title, width: box.width, onTop: top ? top.className : ''};
        })"""
    )
    shown = [(*_reserved_and_free(d["title"]), d["onTop"]) for d in days if d["width"] >= 2]
    fitting = [(reserved, on_top) for reserved, free, on_top in shown if free >= 20]
    short = [on_top for reserved, free, on_top in shown if free < 20]
    assert fitting and short, days
    assert all(on_top == "fit-band" for _, on_top in fitting), days
    assert any(reserved > 0 for reserved, _ in fitting)  # drawn over a reserved bar too
    assert "fit-band" not in short


def test_the_site_icon_is_served_and_pages_load_without_a_failed_request(
    page: Any, fast_shared_server: InProcessServer
) -> None:
    icon = page.request.get(f"{fast_shared_server.url}/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"].startswith("image/")
    failures: list[str] = []
    page.on("requestfailed", lambda request: failures.append(f"failed: {request.url}"))
    page.on("response", lambda r: failures.append(f"{r.status}: {r.url}") if r.status >= 400 else None)
    page.on("console", lambda m: failures.append(f"console: {m.text}") if m.type == "error" else None)
    for path in PAGES:
        _open(page, fast_shared_server, path)
        page.wait_for_load_state("load")
    # The icon the pages link is one the browser can draw.
    size = page.evaluate(
        """async () => {
            const image = new Image();
            image.src = document.querySelector('link[rel=icon]').href;
            await image.decode();
            return [image.naturalWidth, image.naturalHeight];
        }"""
    )
    assert size == [32, 32]
    assert not failures, failures


def test_plan_names_do_not_break_at_hyphens_and_a_short_plan_s_label_ends_in_an_ellipsis(
    page: Any, fast_shared_server: InProcessServer
) -> None:
    page.set_viewport_size({"width": 760, "height": 900})  # a narrow window squeezes the table
    try:
        _open(page, fast_shared_server, "/plans")
        link = page.get_by_role("link", name=LONG_NAME)
        assert link.evaluate("a => a.getClientRects().length") == 1  # one line
    finally:
        page.set_viewport_size({"width": 1366, "height": 900})
    _open(page, fast_shared_server, f"/capacity?instance_type={P5}")
    mark = page.locator(".timeline .mark", has_text=LONG_NAME)
    assert LONG_NAME in (mark.get_attribute("title") or "")  # the whole name, on hovering
    cut, ending = mark.evaluate("m => [m.scrollWidth > m.clientWidth, getComputedStyle(m).textOverflow]")
    assert cut and ending == "ellipsis"  # the cut shows


LENGTH = re.compile(r"^(?:(\d+) days?)? ?(?:(\d+) h)? ?(?:(\d+) min)?$")


def _minutes(text: str) -> int:
    found = LENGTH.match(text.strip())
    assert found and text.strip(), text
    days, hours, minutes = (int(part or 0) for part in found.groups())
    return (days * 24 + hours) * 60 + minutes


def test_offering_cards_show_their_length_and_why_it_is_longer_than_asked(
    page: Any, fast_shared_server: InProcessServer
) -> None:
    # From 18:00 UTC, between two boundaries: the demo calendar's trn2 pools then offer the same three
    # days with and without the partial day before them.
    _open(page, fast_shared_server, "/offerings")
    page.get_by_label("Target").select_option("training-job")
    page.get_by_label("Instance type").select_option("ml.trn2.48xlarge")
    page.get_by_label("Instance count").fill("1")
    page.get_by_label("Duration (days)").fill("3")
    page.get_by_label("Start after").fill("2027-01-14T18:00")
    page.get_by_role("button", name="Search").click()
    cards = page.locator("li.offering")
    cards.first.wait_for()
    longer = 0
    for card in cards.all():
        shown = card.locator("dd.length").inner_text()
        rows = card.locator("table.segments tbody tr").all()
        spans = [
            [datetime.fromisoformat(t.get_attribute("datetime")) for t in row.locator("time").all()]
            for row in rows
        ]
        total = sum((end - start for start, end in spans), timedelta())
        length = shown.splitlines()[0]
        assert _minutes(length) == total // timedelta(minutes=1), shown
        if total > timedelta(days=3):
            longer += 1
            assert shown.splitlines()[1] == (
                "3 days asked; the first segment starts at 18:00 UTC, between two daily boundaries "
                "(11:30 UTC), and also holds the 17 h 30 min up to the next one: segments end on a "
                "boundary, and the price counts the real length."
            )
            assert length == "3 days 17 h 30 min"
        else:
            assert shown.strip() == "3 days", shown
    assert longer == 1


def test_the_header_shows_the_service_clock_and_follows_it(
    page: Any, fast_shared_server: InProcessServer
) -> None:
    def shown() -> str:
        return str(page.locator("#service-clock").inner_text())

    def service_time() -> str:
        now = fast_shared_server.native().get("/api/v1/clock")["Now"]
        return datetime.fromisoformat(now).strftime("%Y-%m-%d %H:%M UTC")

    _open(page, fast_shared_server, "/plans")
    assert service_time() in shown() and "manual clock" in shown()
    fast_shared_server.advance_clock("1h")
    _open(page, fast_shared_server, "/capacity")
    assert service_time() in shown() and "manual clock" in shown()
