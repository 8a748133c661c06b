"""The history bench's turns (bench/history.py, issue 55): how a store's sizes share the rounds. Its
figures are never judged here; the smoke run of the section (tests/test_bench_smoke.py) prints them."""

from __future__ import annotations

from collections import Counter

from bench.history import Sizes, _turns
from bench.scale import Scale


def test_every_size_is_measured_once_a_round_and_none_is_always_first_or_last() -> None:
    sizes = Sizes.of(Scale.FULL)
    turns = list(_turns(list(sizes.multiples), sizes.rounds))
    rounds = [[size for number, size in turns if number == r] for r in range(sizes.rounds)]
    assert all(sorted(one) == sorted(sizes.multiples) for one in rounds)
    assert len(turns) == len(sizes.multiples) * sizes.rounds
    # With as many rounds as sizes, each size opens one round and closes one.
    assert sizes.rounds == len(sizes.multiples)
    assert Counter(one[0] for one in rounds) == Counter(sizes.multiples)
    assert Counter(one[-1] for one in rounds) == Counter(sizes.multiples)


def test_a_round_shares_the_phases_so_that_all_rounds_together_do_what_one_phase_did() -> None:
    for scale in (Scale.FULL, Scale.QUICK):
        sizes = Sizes.of(scale)
        assert sizes.offerings % sizes.rounds == 0  # every round buys its share, none left over
        assert sizes.searches >= 20 * sizes.rounds  # each turn holds the 20 searches it warms up with
