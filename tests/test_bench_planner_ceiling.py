"""The planner's ceiling experiment (bench/planner_ceiling.py, issue 54): its numpy model of the search
books what the service's own replay books, and its oracle never books less than the rankings it improves
on. Figures are never judged here: docs/PLANNING.md gives them with the command that printed them."""

from __future__ import annotations

import pytest

from bench.planner_ceiling import measure
from bench.planner_grid import Point

pytestmark = pytest.mark.bench  # a replay and thousands of rollouts: a part of its own


@pytest.mark.parametrize("point", [Point("issue54", "tight", 0.8), Point("soon", "issue54", 1.3)])
def test_the_oracle_models_the_search_exactly_and_only_adds_to_packing(point: Point) -> None:
    result = measure(point, [0], ["packing"], passes=2, with_refusals=True)
    assert result.model_differs == 0  # its packing and earliest book what replay_on_calendar books
    (packing,) = result.shares["packing"]
    (first_pass,) = result.shares["pass 1"]
    (must_offer,) = result.shares["must offer"]
    (refusals,) = result.shares["refusals"]
    assert packing <= first_pass <= must_offer <= refusals <= 100.0
    assert result.decisions > 0 and result.choices <= result.decisions
