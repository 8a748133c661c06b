"""Migration 0025 on a store that kept deleted clusters' nodes before it: each earlier row is marked as a
plan's node when it was launched inside a holding segment of one of its account's plans in its own pool,
and as on-demand otherwise (the usage report counts only the latter as on-demand hours)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from sqlalchemy import insert, select, text

from hyperplan.store.db import Database
from hyperplan.store.schema import Account, EndedNodeUsage, ReservedCapacity, TrainingPlan
from tests.postgres import Stores

T = datetime(2026, 12, 7, 0, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)
P5 = "ml.p5.48xlarge"
M5 = "ml.m5.12xlarge"
TEAM, OTHER = "100000000002", "100000000003"


def _plan(account: str, name: str, zone: str, holds: bool) -> tuple[TrainingPlan, ReservedCapacity]:
    """A plan of a day of 2 instances; one that failed before it began holds nothing."""
    return TrainingPlan(
        account_id=account,
        name=name,
        offering_id=f"tpo-{name}",
        target="hyperpod-cluster",
        instance_type=P5,
        status="Active" if holds else "Failed",
        upfront_fee=Decimal("1"),
        currency="USD",
        created_at=T,
        updated_at=T,
    ), ReservedCapacity(
        ordinal=1,
        instance_type=P5,
        availability_zone=zone,
        count=2,
        start=T,
        end=T + 24 * HOUR,
        status="Active" if holds else "Failed",
        holds_capacity=holds,
    )


def _ended(
    cluster: str, account: str, instance_type: str, zone: str, launched: datetime
) -> dict[str, object]:
    micros = int((launched - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    return {
        "account": account,
        "cluster": cluster,
        "type": instance_type,
        "zone": zone,
        "launched": micros,
        "ended": micros + 3_600_000_000,
    }


def test_earlier_ended_nodes_are_marked_by_the_segment_they_were_launched_in(
    stores: Stores, tmp_path: Path
) -> None:
    database = Database(stores.empty_url(tmp_path / "store"))
    try:
        database.migrate("0024")
        with database.write() as session:
            for account, name in ((TEAM, "team"), (OTHER, "other")):
                # A Core insert names only these columns and the defaults: the ORM would name every
                # column of today's schema, some of which revision 0024 does not have yet.
                session.execute(insert(Account).values(id=account, name=name, created_at=T))
            for name, zone, holds in (("held", "us-west-2b", True), ("failed", "us-west-2a", False)):
                plan, segment = _plan(TEAM, name, zone, holds)
                session.add(plan)
                session.flush()
                segment.plan_id = plan.id
                session.add(segment)
            rows = [
                _ended("in-segment", TEAM, P5, "us-west-2b", T + HOUR),
                _ended("after-segment", TEAM, P5, "us-west-2b", T + 30 * HOUR),
                _ended("failed-plan", TEAM, P5, "us-west-2a", T + HOUR),
                _ended("other-type", TEAM, M5, "us-west-2b", T + HOUR),
                _ended("other-account", OTHER, P5, "us-west-2b", T + HOUR),
            ]
            session.execute(
                text(
                    "INSERT INTO ended_node_usage (account_id, cluster_id, instance_type, availability_zone, "
                    "launched_at, ended_at, backend_id) "
                    "VALUES (:account, :cluster, :type, :zone, :launched, :ended, '')"
                ),
                rows,
            )
        database.migrate()
        with database.write() as session:
            marked = dict(session.execute(select(EndedNodeUsage.cluster_id, EndedNodeUsage.on_plan)).all())
        assert marked == {
            "in-segment": True,
            "after-segment": False,
            "failed-plan": False,
            "other-type": False,
            "other-account": False,
        }
    finally:
        database.close()
