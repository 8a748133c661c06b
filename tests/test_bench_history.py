"""The history bench's turns (bench/history.py, issue 55): how a store's sizes share the rounds; its
control (the largest size's live plans alone) and how a figure that grows with the fleet is judged. Its
figures are never judged here; the smoke run of the section (tests/test_bench_smoke.py) prints them."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from bench.history import CONTROL_OF, SMOKE_SPEC, SPECS, Sizes, _met, _purchase_costs, _turns, control_spec
from bench.history_build import build
from bench.history_fleet import fleet_file
from bench.scale import Scale
from tests.postgres import PostgresServer


def test_every_size_is_measured_once_a_round_and_none_is_always_first_or_last() -> None:
    sizes = Sizes.of(Scale.FULL)
    assert CONTROL_OF in sizes.multiples  # measured beside its control, in the same turns
    measured = [f"{m}x" for m in sizes.multiples] + ["control"]
    turns = list(_turns(measured, sizes.rounds))
    rounds = [[size for number, size in turns if number == r] for r in range(sizes.rounds)]
    assert all(sorted(one) == sorted(measured) for one in rounds)
    assert len(turns) == len(measured) * sizes.rounds
    # With as many rounds as sizes, each size opens one round and closes one.
    assert sizes.rounds == len(measured)
    assert Counter(one[0] for one in rounds) == Counter(measured)
    assert Counter(one[-1] for one in rounds) == Counter(measured)


def test_the_control_holds_the_live_plans_of_its_size_and_nothing_of_its_past() -> None:
    spec = SPECS[CONTROL_OF]
    control = control_spec(spec)
    assert control.plans == round(spec.plans * spec.live_share) and control.live_share == 1.0
    assert control.accounts == spec.accounts and control.lister_plans == spec.lister_plans  # lists alike
    assert (control.max_segments, control.seed) == (spec.max_segments, spec.seed)


def test_a_figure_that_grows_with_the_fleet_meets_its_target_when_the_history_adds_little() -> None:
    target = ("<=", 100.0)
    assert _met(target, 80.0, 1.2, math.nan) is True  # flat from 1x
    assert _met(target, 80.0, 1.8, math.nan) is False  # grew, and no control to tell why
    assert _met(target, 80.0, 1.8, 1.1) is True  # grew with the fleet's work: the history adds 1.1x
    assert _met(target, 80.0, 1.8, 1.7) is False  # the history itself adds too much
    assert _met(target, 120.0, 1.0, 1.0) is False  # over the limit
    assert _met(target, math.nan, 1.0, 1.0) is None  # not measured


def test_a_round_shares_the_phases_so_that_all_rounds_together_do_what_one_phase_did() -> None:
    for scale in (Scale.FULL, Scale.QUICK):
        sizes = Sizes.of(scale)
        assert sizes.offerings % sizes.rounds == 0  # every round buys its share, none left over
        assert sizes.searches >= 20 * sizes.rounds  # each turn holds the 20 searches it warms up with


@pytest.mark.postgres
def test_on_postgres_the_purchase_costs_rerun_each_refusal_read_under_explain(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """The statement costs of the section's table on PostgreSQL: the heaviest account's purchases, then
    each refusal read they made run again under EXPLAIN ANALYZE. Those reads are prepared statements
    (store/prepared.py), whose SQL has PostgreSQL's own $1, $2: a smoke run of the bench leaves
    PostgreSQL out, and the full run was the first to find them sent to the wrong cursor."""
    history = build(tmp_path / "history", fleet_file(1, tmp_path), SMOKE_SPEC, postgres_server.new_database())
    try:
        costs = _purchase_costs(history, Sizes.of(Scale.SMOKE))
    finally:
        history.close()
    assert costs["purchase statements"] > 0
    assert costs["refusal reads, DB time per purchase (ms)"] > 0
    assert costs["refusal reads, rows per purchase (PostgreSQL)"] > 0
