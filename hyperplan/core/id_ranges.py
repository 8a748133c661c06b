"""The OS ids the server hands accounts' users: a range of the fleet's, and the rule that picks the next.

An id is never handed out twice. ``useradd`` picks the lowest free uid, so a user it made for a deleted
account freed its uid for the next account, which then owned every file the first one left behind. The
server instead takes ids from a range of its own (``[accounts] os_ids`` in the fleet file, default
:data:`DEFAULT_OS_IDS`), records each in the store, and always goes on above the highest it ever gave
from that range, skipping ids the system already has (a user or group made by someone else).

The default, 70000-99999, lies where nothing else hands out ids on a usual Linux machine: above the
regular users' 1000-60000 and the 16-bit "nobody" ids 65534-65535, below 100000 where ``useradd`` starts
subordinate ids (``/etc/subuid``) for user namespaces.

Each account's containers get a block of :data:`SUBORDINATE_BLOCK` ids of their own too (container ids
0..65535 are the block's, so root in a container is nobody on the host), from ``[accounts]
subordinate_ids`` (default :data:`DEFAULT_SUBORDINATE_IDS`), by the same rule: :func:`next_block` goes on
above the highest block ever given from the range, skipping every range someone else holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LOWEST = 1000
"""Below this are the system's own users (root, daemons): never an account's."""
HIGHEST = 2**31 - 2
"""Ids at 2**31 and above are read as negative by some tools; 2**32-1 is (uid_t)-1."""
NEVER = frozenset({65534, 65535})
"""The 16-bit "nobody" and (uint16)-1: never handed out even inside a range."""

_RANGE = re.compile(r"\s*([0-9]{1,10})\s*-\s*([0-9]{1,10})\s*")
_SUBORDINATE_ENTRY = re.compile(r"([^:#\s][^:\s]*):([0-9]{1,10}):([0-9]{1,10})")


@dataclass(frozen=True)
class IdRange:
    first: int
    last: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.first <= value <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def overlaps(self, other: IdRange) -> bool:
        return self.first <= other.last and other.first <= self.last


DEFAULT_OS_IDS = IdRange(70000, 99999)

SUBORDINATE_BLOCK = 65536
"""Ids in one account's block: a container's whole 16-bit range (root, the images' daemons, nobody)."""

# useradd hands out subordinate ids from SUB_UID_MIN 100000 to SUB_UID_MAX 600100000 (login.defs; Debian's
# and shadow's defaults), 65536 a user: 2**30 is far above, so no user made by hand ever gets an account's
# block. The range ends with the last whole block below HIGHEST (16383 blocks), for the reason HIGHEST says.
DEFAULT_SUBORDINATE_IDS = IdRange(2**30, 2**31 - SUBORDINATE_BLOCK - 1)


def parse_id_range(text: str) -> IdRange:
    """``"FIRST-LAST"``, both inclusive. ValueError names what is wrong."""
    match = _RANGE.fullmatch(text)
    if match is None:
        raise ValueError(f'{text!r} is not a range of ids such as "70000-99999"')
    first, last = int(match[1]), int(match[2])
    if first > last:
        raise ValueError(f"{text!r}: the first id is above the last")
    if first < LOWEST:
        raise ValueError(f"{text!r}: ids below {LOWEST} are the system's own (root, daemons)")
    if last > HIGHEST:
        raise ValueError(f"{text!r}: ids above {HIGHEST} are read as negative by some tools")
    return IdRange(first, last)


def next_id(id_range: IdRange, given: Iterable[int], taken: Callable[[int], bool]) -> int | None:
    """The id to hand out next: the lowest in ``id_range`` above every id ``given`` from it (ever, in any
    store this range served), that ``taken`` does not say the system already has. None when the range
    has none left."""
    highest = max((value for value in given if value in id_range), default=id_range.first - 1)
    for candidate in range(highest + 1, id_range.last + 1):
        if candidate not in NEVER and not taken(candidate):
            return candidate
    return None


def next_block(
    id_range: IdRange, size: int, given: Iterable[IdRange], taken: Iterable[IdRange]
) -> IdRange | None:
    """The block of ``size`` ids to hand out next: the lowest in ``id_range`` that starts above every block
    ``given`` from it (ever, in any store this range served: a deleted account's block is never reused)
    and overlaps no range ``taken`` (other users' subordinate ids, blocks another store gave, ids the
    system has) nor the "nobody" ids. None when the range has no room left."""
    if size < 1:
        raise ValueError(f"a block of {size} ids")
    start = max([id_range.first, *(block.last + 1 for block in given if block.overlaps(id_range))])
    nobody = IdRange(min(NEVER), max(NEVER))
    in_the_way = [block for block in (*taken, nobody) if block.overlaps(id_range)]
    while start + size - 1 <= id_range.last:
        candidate = IdRange(start, start + size - 1)
        clashes = [block.last for block in in_the_way if block.overlaps(candidate)]
        if not clashes:
            return candidate
        start = max(clashes) + 1  # past everything in the way: each turn moves up, so this ends
    return None


def parse_subordinate_ids(text: str) -> list[tuple[str, IdRange]]:
    """The entries of ``/etc/subuid`` or ``/etc/subgid`` (``OWNER:FIRST:COUNT`` a line; the owner a user
    name or a uid), each as its owner and its range; lines that are none (comments, garbage, a count of
    0) are left out."""
    entries = []
    for line in text.splitlines():
        match = _SUBORDINATE_ENTRY.fullmatch(line.strip())
        if match is not None and int(match[3]) > 0:
            first = int(match[2])
            entries.append((match[1], IdRange(first, first + int(match[3]) - 1)))
    return entries
