"""What a server on a Slurm back end keeps between passes over the cluster (services/slurm_reservations).

Built by the composition root when the fleet's ``[backend] kind = "slurm"``; None in the context
otherwise. The client is the one way to the cluster; the lock makes each reconciling pass whole (the
periodic one and one a test or a command asks for never interleave); the health is what the last
pass read, for the fleet's report.

Only the leader reads the cluster; it publishes each pool's bookable count and unhealthy nodes in the
store (setting `slurm.pool_health`, written when they change, which moves the `settings` change counter),
and every other process takes them into its calendar and its report (services/runtime/shared_state.py): a
drained node reduces what every process sells.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from hyperplan.core.fleet import PoolKey
from hyperplan.slurm.client import SlurmClient
from hyperplan.worker import LocalWake


@dataclass(frozen=True)
class UnhealthyNode:
    """A pool's node Slurm would not run work on: its state as Slurm says it, and why."""

    name: str
    state: str  # such as "DOWN", "IDLE+DRAIN", "MISSING" (not in Slurm's list at all)
    reason: str | None


@dataclass
class SlurmState:
    client: SlurmClient
    wake: LocalWake = field(default_factory=LocalWake)  # a plan changed: look at its reservations
    lock: threading.Lock = field(default_factory=threading.Lock)
    unhealthy: dict[PoolKey, tuple[UnhealthyNode, ...]] = field(default_factory=dict)
    short: dict[str, int] = field(default_factory=dict)  # reservation -> nodes it lacks (reported once)
    passes: int = 0  # completed reconciling passes, for logs and tests
    published: str | None = None  # the pools' health as this process last wrote it to the store


PoolHealth = dict[PoolKey, tuple[int, tuple[UnhealthyNode, ...]]]  # bookable count, unhealthy nodes


def health_text(health: PoolHealth) -> str:
    """The pools' health as the store keeps it: JSON, in a stable order (unchanged health, same text)."""
    pools = [
        {
            "InstanceType": key[0],
            "AvailabilityZone": key[1],
            "Bookable": bookable,
            "Unhealthy": [[node.name, node.state, node.reason] for node in bad],
        }
        for key, (bookable, bad) in sorted(health.items())
    ]
    return json.dumps(pools, sort_keys=True)


def read_health(text: str) -> PoolHealth:
    return {
        (pool["InstanceType"], pool["AvailabilityZone"]): (
            int(pool["Bookable"]),
            tuple(UnhealthyNode(name, state, reason) for name, state, reason in pool["Unhealthy"]),
        )
        for pool in json.loads(text)
    }
