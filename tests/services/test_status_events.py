"""`services.status.change` on a real store (SQLite and PostgreSQL): one move, one recorded event with the
right fields; a refused move changes and records nothing; plans keep their history in their own table."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import func, select

from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.status import CLUSTER_LIFECYCLE, ClusterStatus, IllegalTransition
from hyperplan.services.accounts import accounts, sealed_secrets
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime import status
from hyperplan.store.db import Database
from hyperplan.store.master_key import KEY_FILE_NAME
from hyperplan.store.schema import Cluster, PlanEvent, StatusEvent, TrainingPlan
from tests.postgres import Stores

T0 = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path, stores: Stores) -> Iterator[Database]:
    database = Database(stores.empty_url(tmp_path))
    database.migrate()
    box = sealed_secrets.unlock(database, tmp_path / KEY_FILE_NAME)
    with database.write() as session:
        accounts.create_account(session, "team", box=box, now=T0, access_key_id="AKHPTEAM000000000000")
    yield database
    database.close()


def _account_id(db: Database) -> str:
    with db.read() as session:
        return accounts.get_account(session, "team").id


def _cluster(db: Database) -> int:
    with db.write() as session:
        cluster = Cluster(
            account_id=_account_id(db),
            name="c",
            cluster_id="abcdefghijkl",
            status=CLUSTER_LIFECYCLE.initial,
            created_at=T0,
        )
        session.add(cluster)
        session.flush()
        return cluster.id


def _events(db: Database) -> list[StatusEvent]:
    with db.read() as session:
        return list(session.scalars(select(StatusEvent).order_by(StatusEvent.id)))


def test_a_change_sets_the_status_and_records_exactly_one_event(db: Database) -> None:
    cluster_id = _cluster(db)
    at = T0 + timedelta(minutes=7)
    with db.write() as session:
        cluster = session.get(Cluster, cluster_id)
        assert cluster is not None
        old = status.change(session, CLUSTER_LIFECYCLE, cluster, ClusterStatus.DELETING, at, "DeleteCluster.")
    assert old == ClusterStatus.IN_SERVICE
    with db.read() as session:
        stored = session.get(Cluster, cluster_id)
        assert stored is not None and stored.status == "Deleting"
        assert [e.id for e in status.history(session, CLUSTER_LIFECYCLE, cluster_id)] == [
            e.id for e in _events(db)
        ]
    [event] = _events(db)
    assert (event.entity_kind, event.entity_id) == ("cluster", cluster_id)
    assert (event.from_status, event.to_status) == ("InService", "Deleting")
    assert (event.at, event.message) == (at, "DeleteCluster.")


def test_a_refused_move_changes_nothing_and_records_nothing(db: Database) -> None:
    cluster_id = _cluster(db)
    refused = pytest.raises(IllegalTransition, match="a cluster cannot go from InService to InService")
    with refused, db.write() as session:
        cluster = session.get(Cluster, cluster_id)
        assert cluster is not None
        status.change(session, CLUSTER_LIFECYCLE, cluster, ClusterStatus.IN_SERVICE, T0)
    with db.write() as session:
        cluster = session.get(Cluster, cluster_id)
        assert cluster is not None
        status.change(session, CLUSTER_LIFECYCLE, cluster, ClusterStatus.DELETING, T0)
        with pytest.raises(IllegalTransition, match="from Deleting to InService"):
            status.change(session, CLUSTER_LIFECYCLE, cluster, ClusterStatus.IN_SERVICE, T0)
    assert [(e.from_status, e.to_status) for e in _events(db)] == [("InService", "Deleting")]


def test_a_plans_move_goes_to_its_own_history_not_to_status_events(db: Database) -> None:
    with db.write() as session:
        plan = TrainingPlan(
            account_id=_account_id(db),
            name="p",
            offering_id="offering-p",
            target="training-job",
            instance_type="ml.p5.48xlarge",
            status=PlanStatus.PENDING,
            upfront_fee=Decimal("1.00"),
            currency="USD",
            created_at=T0,
            updated_at=T0,
        )
        session.add(plan)
        session.flush()
        lifecycle.transition(session, plan, PlanStatus.FAILED, "Payment failed.", "payment-failed", T0)
        with pytest.raises(IllegalTransition, match="a plan cannot go from Failed to Active"):
            lifecycle.transition(session, plan, PlanStatus.ACTIVE, "no", "status", T0 + timedelta(hours=1))
        assert (plan.status, plan.status_message, plan.updated_at) == ("Failed", "Payment failed.", T0)
        plan_id = plan.id
    with db.read() as session:
        events = list(session.scalars(select(PlanEvent).where(PlanEvent.plan_id == plan_id)))
        assert [(e.kind, e.status, e.message) for e in events] == [
            ("payment-failed", "Failed", "Payment failed.")
        ]
        assert session.scalar(select(func.count(StatusEvent.id))) == 0
