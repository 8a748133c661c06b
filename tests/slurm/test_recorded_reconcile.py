"""The Slurm reconciler's pass over recorded Slurm output (bench/history_slurm.py, the bench of issue 55):
at a small size, the pass the bench times decides exactly the changes the store and the cluster call
for. No Slurm daemon and no root: the pass is the real one (parsers, planning, a real SQLite store, the
plans' histories); only the tools' output is recorded, in the shape of the real output captured from the
dev cluster (tests/slurm/captured/), and each change is applied as slurmctld applies it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from bench.history_slurm import (
    Cluster,
    RecordedSlurm,
    Scenario,
    Shape,
    recorded_runtime,
)
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.slurm.slurm_reservations import reconcile
from hyperplan.slurm.parse import key_values
from hyperplan.store.schema import PlanEvent, TrainingPlan

CAPTURED = Path(__file__).with_name("captured")
SHAPE = Shape.of(20, 8)  # 4 pools of 5 nodes: one of each situation (made, corrected, deleted, limited)

Recorded = tuple[ServiceContext, RecordedSlurm, Scenario]


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[Recorded]:
    with recorded_runtime(tmp_path, SHAPE) as found:
        yield found


def _named(commands: list[tuple[str, ...]], verb: str) -> list[str]:
    return [
        word.removeprefix("ReservationName=")
        for words in commands
        if words[1] == verb
        for word in words
        if word.startswith("ReservationName=")
    ]


def _limited(commands: list[tuple[str, ...]]) -> list[int]:
    return [int(w.removeprefix("JobId=")) for words in commands for w in words if w.startswith("JobId=")]


def test_one_pass_makes_the_missing_corrects_the_changed_and_deletes_the_stale(recorded: Recorded) -> None:
    runtime, slurm, made = recorded
    assert made.expect_created and made.expect_updated and made.expect_deleted and made.expect_limited
    reconcile(runtime)
    assert _named(slurm.changes, "create") == made.expect_created
    assert _named(slurm.changes, "update") == made.expect_updated
    assert _named(slurm.changes, "delete") == made.expect_deleted
    assert _limited(slurm.changes) == made.expect_limited
    held = slurm.cluster.reservations
    assert set(made.expect_created) <= held.keys() and not set(made.expect_deleted) & held.keys()
    segment_end = {
        plan["id"]: segment["end"]
        for plan in made.plans
        for segment in made.segments
        if segment["plan_id"] == plan["id"]
    }
    for name in made.expect_updated:  # the end the plan's segment has, not the one Slurm had
        plan_id = next(p["id"] for p in made.plans if name.endswith(f"-{p['name']}-rc1"))
        assert held[name].end == segment_end[plan_id]


def test_each_change_is_in_its_plans_history(recorded: Recorded) -> None:
    runtime, _slurm, made = recorded
    reconcile(runtime)
    with runtime.db.read() as session:
        kinds = {
            (name, kind)
            for name, kind in session.execute(
                select(TrainingPlan.name, PlanEvent.kind)
                .join(PlanEvent, PlanEvent.plan_id == TrainingPlan.id)
                .where(PlanEvent.kind.like("slurm-%"))
            )
        }
    expected = {
        *((_plan_name(name), "slurm-reservation-made") for name in made.expect_created),
        *((_plan_name(name), "slurm-reservation-corrected") for name in made.expect_updated),
        *((_plan_name(name), "slurm-reservation-deleted") for name in made.expect_deleted),
    }
    assert kinds == expected


def test_a_pass_over_what_the_last_one_left_changes_nothing(recorded: Recorded) -> None:
    runtime, slurm, _made = recorded
    reconcile(runtime)
    first = list(slurm.changes)
    slurm.changes.clear()
    reconcile(runtime)
    assert first and slurm.changes == []


def test_the_recorded_output_has_the_shape_slurm_prints(recorded: Recorded) -> None:
    """The keys of every generated line, in order, as in the real output of the same command (keys
    that only some real lines have, such as Reason or Reservation, aside)."""
    _runtime, slurm, _made = recorded
    cluster: Cluster = slurm.recorded
    for generated, captured in (
        (cluster.node_text(), "show_node.txt"),
        (cluster.reservation_text(), "show_reservation.txt"),
        (cluster.job_text(), "show_job.txt"),
    ):
        real = [list(key_values(text)) for text in (CAPTURED / captured).read_text().splitlines() if text]
        everywhere = set.intersection(*(set(keys) for keys in real))
        anywhere = set.union(*(set(keys) for keys in real))
        common = [key for key in real[0] if key in everywhere]
        for text in generated.splitlines():
            keys = list(key_values(text))
            assert set(keys) <= anywhere, (captured, set(keys) - anywhere)
            assert [key for key in keys if key in everywhere] == common, captured


def _plan_name(reservation: str) -> str:
    """hp-<12 digits>-<plan name>-rc<N>: the plan's name."""
    return reservation[len("hp-000000000000-") :].rsplit("-rc", 1)[0]
