"""What a server on a Slurm back end keeps between passes over the cluster (services/slurm_reservations).

Built by the composition root when the fleet's ``[backend] kind = "slurm"``; None in the context
otherwise. The client is the one way to the cluster; the lock makes each reconciling pass whole (the
periodic one and one a test or a command asks for never interleave); the health is what the last
pass read, for the fleet's report.
"""

from __future__ import annotations

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
