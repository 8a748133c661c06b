"""Pools' capacity following their nodes' health (each pass of slurm_reservations).

A pool's node that Slurm reports DOWN, DRAINED, FAILED (:func:`failed`) or does not know is unhealthy:
the pool's bookable count becomes its reservable count less those (never below what is held: bookings
stay), so searches and purchases see it, and the fleet's report names them with Slurm's reason. The
counts are published in the store for the other processes (services/runtime/slurm_state.py).
"""

from __future__ import annotations

from hyperplan.core.fleet import Fleet
from hyperplan.services.runtime.live_calendar import LiveCalendar
from hyperplan.services.runtime.slurm_state import PoolHealth, SlurmState, UnhealthyNode, health_text
from hyperplan.slurm.parse import Node
from hyperplan.store import settings
from hyperplan.store.db import Database


def state_of(node: Node | None) -> str:
    if node is None:
        return "MISSING (not in Slurm's list of nodes)"
    return _state_and_flags(node) + (f" ({node.reason})" if node.reason else "")


def _state_and_flags(node: Node) -> str:
    """As sinfo writes it: IDLE+DRAIN."""
    flags = "+".join(sorted(node.flags))
    return node.state + (f"+{flags}" if flags else "")


def follow_health(
    db: Database, fleet: Fleet, calendar: LiveCalendar, state: SlurmState, nodes: dict[str, Node]
) -> set[str]:
    """Each pool's health from Slurm's nodes: into this process's calendar and report, and published in
    the store for the others (services/runtime/slurm_state.py). Returns the healthy nodes' names."""
    healthy = set()
    health: PoolHealth = {}
    for pool in fleet.pools:
        bad = []
        for name in pool.nodes:
            node = nodes.get(name)
            if node is None:
                bad.append(UnhealthyNode(name, "MISSING", "not in Slurm's list of nodes"))
            elif not failed(node):
                healthy.add(name)
            else:
                bad.append(UnhealthyNode(name, _state_and_flags(node), node.reason))
        if pool.nodes:
            state.unhealthy[pool.key] = tuple(bad)
            bookable = max(0, min(pool.reservable, len(pool.nodes) - len(bad)))
            calendar.set_reservable(pool.key, bookable)
            health[pool.key] = (bookable, tuple(bad))
    _publish(db, state, health)
    return healthy


def _publish(db: Database, state: SlurmState, health: PoolHealth) -> None:
    """The pools' health in the store, when it changed (the write moves the settings counter, which
    every process reads before a request)."""
    text = health_text(health)
    if text == state.published:
        return
    with db.write() as session:
        if settings.get(session, settings.POOL_HEALTH) != text:
            settings.put(session, settings.POOL_HEALTH, text)
    state.published = text


# DOWN, DRAINED (or draining), FAIL and the like take a node out. Not responding alone, or a state Slurm
# does not know yet, does not: both are passing (a controller restarting, a node registering, a node
# just resumed), and Slurm marks a node that stays silent DOWN after SlurmdTimeout. Counting them would
# replace the nodes of running reservations at every controller restart (every node reads UNKNOWN for
# a few seconds after slurmctld restarts on its saved state).
_FAILED_STATES = frozenset({"DOWN", "FAIL", "FUTURE"})
_FAILED_FLAGS = frozenset({"DRAIN", "FAIL", "MAINTENANCE", "POWERED_DOWN"})


def failed(node: Node) -> bool:
    """Slurm reports the node out of service (see above)."""
    return node.state in _FAILED_STATES or bool(node.flags & _FAILED_FLAGS)
