"""What a container of an instance type may use on this host (runtime ``podman``), and what a Slurm job's
instance may use on its node: the rule is core/container_limits.py's; here the fleet's figures (and, for
a container, this host's size) go into it."""

from __future__ import annotations

import os

from hyperplan.backends.base import Limits
from hyperplan.core.container_limits import container_limits
from hyperplan.services.runtime.context import ServiceContext


def limits_for(runtime: ServiceContext, instance_type: str, zone: str | None) -> Limits:
    """The instance type's size times its pool's share (the pool in ``zone``, else its type's first),
    within this host's CPUs and memory."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpus, memory_bytes, pids = container_limits(
        runtime.fleet.instance_type(instance_type),
        _scale(runtime, instance_type, zone),
        os.cpu_count() or 1,
        memory,
    )
    return Limits(cpus, memory_bytes, pids)


def slurm_memory_for(runtime: ServiceContext, instance_type: str, zone: str | None) -> int | None:
    """The memory (bytes) one instance may use on its Slurm node: the same rule, but not within this
    host's memory, as the work runs on the cluster's nodes (Slurm refuses more than a node declares).
    None for a type the fleet has no figures for (no pool sells it: nothing to size)."""
    try:
        kind = runtime.fleet.instance_type(instance_type)
    except KeyError:
        return None
    unbounded = kind.memory_gib * 2**30  # the rule's host bound: no bound below the type's own size
    _, memory_bytes, _ = container_limits(kind, _scale(runtime, instance_type, zone), 1, unbounded)
    return memory_bytes


def _scale(runtime: ServiceContext, instance_type: str, zone: str | None) -> float:
    """The pool's ``limits_scale``: the pool in ``zone``, else its type's first; 1 without one."""
    pools = runtime.fleet.pools_of_type(instance_type)
    in_zone = [pool for pool in pools if pool.availability_zone == zone]
    return (in_zone or list(pools))[0].limits_scale if pools else 1.0
