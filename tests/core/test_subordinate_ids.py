"""Accounts' containers' blocks of host ids: the fleet's range, the rule that picks the next block (never
one given before, never one someone holds), and the entries of /etc/subuid and /etc/subgid."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.id_ranges import (
    DEFAULT_OS_IDS,
    DEFAULT_SUBORDINATE_IDS,
    HIGHEST,
    NEVER,
    SUBORDINATE_BLOCK,
    IdRange,
    next_block,
    parse_subordinate_ids,
)
from hyperplan.errors import ValidationError
from tests.core.test_fleet import MINIMAL

SMALL = IdRange(1000, 1099)  # room for ten blocks of ten


def test_the_default_range_is_whole_blocks_above_what_useradd_hands_out_and_below_negative_ids() -> None:
    assert DEFAULT_SUBORDINATE_IDS.first > 600_100_000  # login.defs' SUB_UID_MAX: useradd's last
    assert DEFAULT_SUBORDINATE_IDS.last <= HIGHEST
    assert DEFAULT_SUBORDINATE_IDS.size % SUBORDINATE_BLOCK == 0
    assert DEFAULT_SUBORDINATE_IDS.size // SUBORDINATE_BLOCK == 16383
    assert not DEFAULT_SUBORDINATE_IDS.overlaps(DEFAULT_OS_IDS)


def test_blocks_go_on_above_the_highest_ever_given() -> None:
    assert next_block(SMALL, 10, [], []) == IdRange(1000, 1009)
    # 1010-1019 was given and its account deleted: nothing below its end is looked at again
    assert next_block(SMALL, 10, [IdRange(1000, 1009), IdRange(1010, 1019)], []) == IdRange(1020, 1029)
    assert next_block(SMALL, 10, [IdRange(1010, 1019)], []) == IdRange(1020, 1029)
    assert next_block(SMALL, 10, [IdRange(1090, 1099)], []) is None
    assert next_block(SMALL, 101, [], []) is None
    # A block given from another range (the fleet's was changed) does not move this one; one that
    # reaches into it does.
    assert next_block(SMALL, 10, [IdRange(5000, 5009)], []) == IdRange(1000, 1009)
    assert next_block(SMALL, 10, [IdRange(990, 1004)], []) == IdRange(1005, 1014)
    with pytest.raises(ValueError):
        next_block(SMALL, 0, [], [])


def test_a_block_skips_every_range_someone_holds_and_the_nobody_ids() -> None:
    # another user's /etc/subuid entry, then a single id the system has
    assert next_block(SMALL, 10, [], [IdRange(995, 1003)]) == IdRange(1004, 1013)
    assert next_block(SMALL, 10, [], [IdRange(1000, 1003), IdRange(1012, 1012)]) == IdRange(1013, 1022)
    assert next_block(SMALL, 10, [], [IdRange(1000, 1099)]) is None
    around = IdRange(65500, 65600)
    assert next_block(around, 30, [], []) == IdRange(65500, 65529)
    assert next_block(around, 40, [], []) == IdRange(65536, 65575)  # not across 65534-65535


@given(
    first=st.integers(1000, 3000),
    size=st.integers(1, 40),
    room=st.integers(1, 400),
    taken=st.lists(
        st.tuples(st.integers(900, 3500), st.integers(0, 30)).map(lambda t: IdRange(t[0], t[0] + t[1])),
        max_size=12,
    ),
    accounts=st.integers(1, 12),
)
def test_blocks_handed_out_one_after_another_never_overlap_nor_meet_what_is_taken(
    first: int, size: int, room: int, taken: list[IdRange], accounts: int
) -> None:
    id_range = IdRange(first, first + room - 1)
    given_blocks: list[IdRange] = []
    for _ in range(accounts):
        block = next_block(id_range, size, given_blocks, taken)
        if block is None:
            # none left: no room of `size` free ids above the last block given
            start = max([first, *(b.last + 1 for b in given_blocks)])
            held = set().union(*(range(t.first, t.last + 1) for t in taken)) | NEVER
            free = [v for v in range(start, id_range.last + 1) if v not in held]
            runs = [v for v in free if all(v + k in free for k in range(size))]
            assert not runs
            break
        assert block.size == size and block.first in id_range and block.last in id_range
        assert not any(block.overlaps(t) for t in taken)
        assert not any(block.overlaps(b) for b in given_blocks)
        assert not any(v in block for v in NEVER)
        assert all(block.first > b.last for b in given_blocks)  # never below one given: never reused
        given_blocks.append(block)


def test_subuid_entries_are_read_by_owner_and_range() -> None:
    text = (
        "alice:100000:65536\n"
        "1001:165536:65536\n"
        "# a comment:1:2\n"
        "\n"
        "broken line\n"
        "bob:x:65536\n"
        "carol:200000:0\n"
        "  hp-000000000001:1073741824:65536  \n"
    )
    assert parse_subordinate_ids(text) == [
        ("alice", IdRange(100000, 165535)),
        ("1001", IdRange(165536, 231071)),
        ("hp-000000000001", IdRange(1073741824, 1073807359)),
    ]


def _fleet_with(accounts: str) -> str:
    return MINIMAL + "[accounts]\n" + accounts


def test_the_fleet_file_sets_the_range_and_defaults_to_the_constant() -> None:
    assert parse_fleet(MINIMAL).subordinate_ids == DEFAULT_SUBORDINATE_IDS
    fleet = parse_fleet(_fleet_with('subordinate_ids = "200000000-200131071"\n'))
    assert fleet.subordinate_ids == IdRange(200000000, 200131071)


@pytest.mark.parametrize(
    ("accounts", "complaint"),
    [
        ('subordinate_ids = "lots"\n', "accounts.subordinate_ids: 'lots' is not a range of ids"),
        ("subordinate_ids = 5\n", "accounts.subordinate_ids"),
        ('subordinate_ids = "100-200000"\n', "accounts.subordinate_ids: .*the system's own"),
        (
            'subordinate_ids = "200000-265534"\n',
            "accounts.subordinate_ids: 200000-265534 holds 65535 ids, fewer than one account's block",
        ),
        (
            'subordinate_ids = "90000-200000"\n',
            "accounts.subordinate_ids: 90000-200000 overlaps os_ids 70000-99999",
        ),
        (
            'os_ids = "1100000000-1100000999"\n',
            "accounts.subordinate_ids: the default, 1073741824-2147418111, overlaps os_ids",
        ),
    ],
)
def test_a_range_that_is_not_one_is_too_small_or_meets_the_users_ids_is_refused(
    accounts: str, complaint: str
) -> None:
    with pytest.raises(ValidationError, match=complaint):
        parse_fleet(_fleet_with(accounts))
