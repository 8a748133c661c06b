"""The service in this process, for tests of the services' rules: a store of its own (SQLite in the
test's directory, or a PostgreSQL database), the fake back end, a manual clock started at the instant
the test chooses; and the accounts such tests buy with."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from hyperplan.app import AppConfig, Application
from hyperplan.backends.fake import FakeBackend, FakeWorld
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import payments
from hyperplan.services.runtime.context import ServiceContext
from tests.harness import SERVER_START, unisolated

P5 = "ml.p5.48xlarge"
ZONE = "us-west-2a"


def one_pool_fleet(
    count: int, reservable: int | None = None, price: str = "40.00", more: str = "", policy: str = ""
) -> str:
    """A fleet file of one pool of p5s in us-west-2a that sells any count; `more`: TOML added after the
    pool (its own keys, then tables); `policy`: keys added to [policy]."""
    return f"""
region = "us-west-2"
currency = "USD"
[[zones]]
name = "{ZONE}"
zone_id = "usw2-az1"
subnets = []
[[pools]]
instance_type = "{P5}"
zone = "{ZONE}"
count = {count}
reservable = {count if reservable is None else reservable}
price_per_instance_hour = "{price}"
{more}
[policy]
allowed_counts = "any"
{policy}
"""


@contextmanager
def application(
    tmp_path: Path,
    fleet_text: str,
    *,
    clock_start: datetime = SERVER_START,
    database_url: str | None = None,
    start: bool = True,
) -> Iterator[Application]:
    """The service on `fleet_text`, stopped at the end. `start`: its workers run (the lifecycle loop
    among them); without, it is only opened, and the test runs what it needs itself."""
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(fleet_text)
    world = FakeWorld()
    app = Application(
        AppConfig(
            data_dir=tmp_path / "data",
            fleet_path=fleet_path,
            clock="manual",
            clock_start=clock_start,
            database_url=database_url,
            backend=lambda _work_dir: FakeBackend(world),
            **unisolated(tmp_path / "data"),
        )
    )
    if start:
        app.start()
    else:
        app.open()
    try:
        yield app
    finally:
        app.stop()


def new_account(
    runtime: ServiceContext, name: str, mode: str = "auto", budget: Decimal | None = None
) -> Caller:
    """An account paying in `mode`, granted `budget` as an administrator grants it."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        key = accounts.create_account(session, name, box=runtime.secret_box, now=now, payment_mode=mode)
        if budget is not None:
            payments.update_account(session, name, mode=None, budget=None, add_budget=budget, now=now)
    return Caller(key.account_id, name, False, key.access_key_id)
