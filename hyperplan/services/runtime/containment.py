"""What a container of an instance type may use on this host (runtime ``podman``): the rule is
core/container_limits.py's; here the fleet's figures and this host's size go into it."""

from __future__ import annotations

import os

from hyperplan.backends.base import Limits
from hyperplan.core.container_limits import container_limits
from hyperplan.services.runtime.context import ServiceContext


def limits_for(runtime: ServiceContext, instance_type: str, zone: str | None) -> Limits:
    """The instance type's size times its pool's share (the pool in ``zone``, else its type's first),
    within this host's CPUs and memory."""
    pools = runtime.fleet.pools_of_type(instance_type)
    in_zone = [pool for pool in pools if pool.availability_zone == zone]
    scale = (in_zone or list(pools))[0].limits_scale if pools else 1.0
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpus, memory_bytes, pids = container_limits(
        runtime.fleet.instance_type(instance_type), scale, os.cpu_count() or 1, memory
    )
    return Limits(cpus, memory_bytes, pids)
