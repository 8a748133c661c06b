"""Which of a pool's nodes each reservation holds: the calendar books counts, this names the nodes.

Counts that fit at every instant can still fit on no single set of nodes if nodes are handed out
carelessly, so the nodes of reservations that have not started are (re)assigned, greedily in start
order, whenever a booking or a node's health needs it. Reservations that have started keep their
healthy nodes (work may run on them) and have a failed node replaced by a free healthy one when there
is one. Greedy in start order never fails while the counts fit: when a reservation is placed, every
node taken during its interval belongs to a reservation placed before it, so to one that started no
later and is still running at its start; they are at most the reservable count at that instant, less
its own. (Intervals are half-open: one ending at 12:00 and one starting at 12:00 may share a node.)

A reservation that has not started keeps the nodes it already holds where they are still healthy and
free, so a pass that needs no change changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Wanted:
    """One reservation to place: `count` nodes of the pool over [start, end)."""

    name: str
    start: datetime
    end: datetime
    count: int
    started: bool = False  # it has begun: work may run on its nodes, so it keeps them
    current: tuple[str, ...] = ()  # the nodes it holds now (none if it does not exist yet)

    def overlaps(self, other: Wanted) -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class Placement:
    name: str
    nodes: tuple[str, ...]  # in the pool's order
    replaced: tuple[tuple[str, str], ...] = ()  # (failed node, its replacement) of a started reservation
    lost: tuple[str, ...] = ()  # nodes it held that are unhealthy (replaced or not)


@dataclass(frozen=True)
class Assignment:
    placements: Mapping[str, Placement] = field(default_factory=dict)
    short: Mapping[str, int] = field(default_factory=dict)  # name -> nodes it lacks (nothing free)


def assign(pool_nodes: Sequence[str], healthy: Iterable[str], wanted: Iterable[Wanted]) -> Assignment:
    """Nodes for each wanted reservation of one pool (see the module's docstring).

    Started reservations come first and keep their healthy nodes; then every reservation in start order
    (ties by name) takes what it still needs, preferring the nodes it held, from the healthy nodes of
    the pool no reservation placed before it holds during its interval. A reservation that cannot get
    all it needs is in `short`, with how many it lacks; it keeps the nodes it got.
    """
    order = {node: index for index, node in enumerate(pool_nodes)}
    usable = {node for node in healthy if node in order}
    items = sorted(wanted, key=lambda w: (not w.started, w.start, w.name))

    def in_order(nodes: Iterable[str]) -> list[str]:
        return sorted(nodes, key=lambda node: order[node])

    # First every started reservation keeps its healthy nodes (two never share one: Slurm refuses it,
    # but a node named twice goes to the first); then each, in order, takes what it still lacks.
    held: dict[str, set[str]] = {}
    for want in items:
        if want.started:
            claimed = set().union(*held.values()) if held else set()
            keep = [n for n in in_order(set(want.current) & usable) if n not in claimed]
            held[want.name] = set(keep[: want.count])
    placed: list[tuple[Wanted, set[str]]] = []
    placements: dict[str, Placement] = {}
    short: dict[str, int] = {}

    def taken_during(want: Wanted) -> set[str]:
        busy: set[str] = set()
        for other, nodes in placed:
            if other.overlaps(want):
                busy |= nodes
        for name, nodes in held.items():  # started ones not placed yet keep theirs
            if name != want.name and name not in placements:
                busy |= nodes
        return busy

    for want in items:
        free = usable - taken_during(want)
        lost = tuple(in_order(n for n in set(want.current) if n in order and n not in usable))
        if want.started:
            chosen = set(held[want.name])
        else:
            chosen = set(in_order(set(want.current) & free)[: want.count])
        fill = in_order(free - chosen)[: want.count - len(chosen)]
        chosen |= set(fill)
        replaced = tuple(zip(lost, fill, strict=False)) if want.started else ()
        placed.append((want, chosen))
        placements[want.name] = Placement(want.name, tuple(in_order(chosen)), replaced, lost)
        if len(chosen) < want.count:
            short[want.name] = want.count - len(chosen)
    return Assignment(placements, short)
