"""Nodes for reservations (hyperplan/core/node_assignment.py): table tests and a property test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.node_assignment import Wanted, assign

T0 = datetime(2027, 3, 10, 11, 30, tzinfo=UTC)
NODES = ("n1", "n2", "n3", "n4")


def at(hours: int) -> datetime:
    return T0 + timedelta(hours=hours)


def nodes_of(result: object, name: str) -> tuple[str, ...]:
    return result.placements[name].nodes  # type: ignore[attr-defined]


def test_new_reservations_take_free_nodes_in_start_order() -> None:
    result = assign(
        NODES,
        NODES,
        [Wanted("b", at(2), at(4), 2), Wanted("a", at(0), at(3), 3), Wanted("c", at(3), at(5), 2)],
    )
    assert nodes_of(result, "a") == ("n1", "n2", "n3")
    assert nodes_of(result, "b") == ("n4",)  # only one node free while a runs: b is short
    assert result.short == {"b": 1}


def test_counts_that_fit_always_find_nodes_greedy_by_start() -> None:
    # Two nodes; at most two reservations at once. Had c kept n1 and a kept n2, b (overlapping both)
    # would find no node: in start order c gives up n1, held by b during [3, 4).
    wanted = [
        Wanted("c", at(3), at(5), 1, current=("n1",)),
        Wanted("a", at(0), at(2), 1, current=("n2",)),
        Wanted("b", at(1), at(4), 1),
    ]
    result = assign(("n1", "n2"), ("n1", "n2"), wanted)
    assert result.short == {}
    assert (nodes_of(result, "a"), nodes_of(result, "b"), nodes_of(result, "c")) == (
        ("n2",),
        ("n1",),
        ("n2",),
    )


def test_a_reservation_keeps_its_nodes_when_nothing_needs_a_change() -> None:
    result = assign(NODES, NODES, [Wanted("a", at(0), at(3), 2, current=("n3", "n4"))])
    assert nodes_of(result, "a") == ("n3", "n4")
    assert result.placements["a"].replaced == ()


def test_ends_are_exclusive() -> None:
    result = assign(("n1",), ("n1",), [Wanted("a", at(0), at(2), 1), Wanted("b", at(2), at(4), 1)])
    assert nodes_of(result, "a") == nodes_of(result, "b") == ("n1",) and result.short == {}


def test_a_started_reservation_keeps_its_healthy_nodes_and_replaces_a_failed_one() -> None:
    started = Wanted("a", at(0), at(5), 2, started=True, current=("n3", "n4"))
    later = Wanted("b", at(1), at(6), 1, current=("n1",))
    result = assign(NODES, {"n1", "n2", "n3"}, [later, started])
    assert nodes_of(result, "a") == ("n1", "n3")  # n4 failed; n1 free and first in the pool's order
    assert result.placements["a"].replaced == (("n4", "n1"),)
    assert result.placements["a"].lost == ("n4",)
    assert nodes_of(result, "b") == ("n2",)  # not started: moved off n1
    assert result.short == {}


def test_without_a_free_node_the_started_reservation_is_short() -> None:
    started = Wanted("a", at(0), at(5), 2, started=True, current=("n1", "n2"))
    other = Wanted("b", at(-1), at(5), 2, started=True, current=("n3", "n4"))
    result = assign(NODES, {"n1", "n3", "n4"}, [started, other])
    assert nodes_of(result, "a") == ("n1",) and result.placements["a"].replaced == ()
    assert result.short == {"a": 1}
    assert nodes_of(result, "b") == ("n3", "n4")


def test_nodes_outside_the_pool_are_never_given() -> None:
    result = assign(("n1", "n2"), {"n1", "n2", "x9"}, [Wanted("a", at(0), at(1), 3, current=("x9",))])
    assert nodes_of(result, "a") == ("n1", "n2") and result.short == {"a": 1}


# -- the property ------------------------------------------------------------------------------------

POOL = tuple(f"n{i}" for i in range(1, 7))


@st.composite
def cases(draw: st.DrawFn) -> tuple[set[str], list[Wanted]]:
    healthy = set(draw(st.lists(st.sampled_from(POOL), unique=True)))
    wanted = []
    for index in range(draw(st.integers(0, 7))):
        started = draw(st.booleans())
        start = draw(st.integers(-6, 0)) if started else draw(st.integers(1, 10))
        end = draw(st.integers(max(start, 0) + 1, 14))
        current = tuple(draw(st.lists(st.sampled_from(POOL), unique=True, max_size=4)))
        wanted.append(Wanted(f"r{index}", at(start), at(end), draw(st.integers(1, 4)), started, current))
    # Started reservations never share a node (Slurm refuses overlapping reservations on one node).
    seen: set[str] = set()
    fixed = []
    for want in wanted:
        current = tuple(n for n in want.current if not (want.started and n in seen))
        if want.started:
            seen |= set(current)
        fixed.append(Wanted(want.name, want.start, want.end, want.count, want.started, current))
    return healthy, fixed


@settings(max_examples=100, deadline=None)
@given(cases())
def test_property_no_node_twice_only_healthy_started_keep_theirs(case: tuple[set[str], list[Wanted]]) -> None:
    healthy, wanted = case
    result = assign(POOL, healthy, wanted)
    by_name = {w.name: w for w in wanted}
    for name, placement in result.placements.items():
        want = by_name[name]
        assert set(placement.nodes) <= healthy  # never a node that is not healthy
        assert len(placement.nodes) + result.short.get(name, 0) == want.count
        if want.started:  # started ones keep their healthy nodes (up to their count)
            keep = [n for n in want.current if n in healthy]
            assert set(keep[: want.count]) <= set(placement.nodes) or len(keep) > want.count
        for other_name, other in result.placements.items():
            if other_name != name and want.overlaps(by_name[other_name]):
                assert set(placement.nodes).isdisjoint(other.nodes)  # no node in two at once
    # While the counts fit on the healthy nodes at every instant, nobody is short.
    instants = {w.start for w in wanted} | {w.end for w in wanted}
    if all(sum(w.count for w in wanted if w.start <= t < w.end) <= len(healthy) for t in instants):
        started_fit = all(len([n for n in w.current if n in healthy]) <= w.count for w in wanted if w.started)
        if started_fit:
            assert result.short == {}
