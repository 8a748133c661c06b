"""The OS ids accounts get: a range of the fleet's, never an id twice, never one the system has."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.id_ranges import DEFAULT_OS_IDS, NEVER, IdRange, next_id, parse_id_range


def test_a_range_is_read_from_the_fleet_files_text() -> None:
    assert parse_id_range("70000-99999") == DEFAULT_OS_IDS
    assert parse_id_range(" 2000 - 2999 ") == IdRange(2000, 2999)
    assert parse_id_range("5000-5000").size == 1


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("70000", "is not a range of ids"),
        ("a-b", "is not a range of ids"),
        ("9000-8000", "the first id is above the last"),
        ("0-99999", "the system's own"),
        ("999-2000", "the system's own"),
        ("70000-4294967295", "read as negative"),
    ],
)
def test_a_range_that_could_hand_out_a_system_id_or_a_negative_one_is_refused(
    text: str, complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_id_range(text)


def test_ids_go_on_above_the_highest_ever_given_skipping_those_the_system_has() -> None:
    small = IdRange(1000, 1009)
    assert next_id(small, [], lambda _: False) == 1000
    # 1003 was given and its account deleted: ids below the highest given are never looked at again.
    assert next_id(small, [1000, 1003], lambda _: False) == 1004
    assert next_id(small, [1003], lambda value: value in (1004, 1005)) == 1006
    assert next_id(small, [1009], lambda _: False) is None
    assert next_id(small, [], lambda _: True) is None
    # Ids given from another range (the fleet's range was changed) do not move this one.
    assert next_id(small, [5000, 999], lambda _: False) == 1000


def test_the_nobody_ids_are_never_handed_out() -> None:
    around = IdRange(65530, 65540)
    assert next_id(around, [65533], lambda _: False) == 65536


@given(
    first=st.integers(1000, 5000),
    size=st.integers(1, 60),
    given_ids=st.lists(st.integers(900, 5100), max_size=20),
    taken=st.frozensets(st.integers(1000, 5100), max_size=30),
)
def test_the_next_id_is_in_the_range_free_and_above_everything_given_from_it(
    first: int, size: int, given_ids: list[int], taken: frozenset[int]
) -> None:
    id_range = IdRange(first, first + size - 1)
    chosen = next_id(id_range, given_ids, taken.__contains__)
    inside = [value for value in given_ids if value in id_range]
    above = range(max(inside, default=first - 1) + 1, id_range.last + 1)
    free = [value for value in above if value not in taken and value not in NEVER]
    if chosen is None:
        assert not free
    else:
        assert chosen == free[0]
        assert chosen in id_range and chosen not in given_ids and chosen not in taken
