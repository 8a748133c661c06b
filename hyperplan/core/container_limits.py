"""What one container of an instance type may use: its size, times its pool's share, within the host.

A pool's ``limits_scale`` (fleet file, default 1) is the share of an instance's published size a container
gets: 1 where one host is one instance, less where a pool of big types is played by a small host (the
demo fleet's p5 on a laptop). The result never exceeds the host itself (Podman refuses more CPUs than the
host has) and never falls below a floor a process needs to start at all.

Processes (threads included) get :data:`PIDS_PER_CPU` for each CPU the container may use: enough for
data loaders and their threads, and a bound a fork bomb meets long before the host's own limit.
"""

from __future__ import annotations

from hyperplan.core.instance_types import InstanceType

MIN_CPUS = 0.1
MIN_MEMORY = 64 * 2**20
PIDS_PER_CPU = 1024
MIN_PIDS = 256
MAX_PIDS = 32_768  # what Podman 4.3 can give a container at most (containers/podman.py)
GIB = 2**30


def container_limits(
    kind: InstanceType, scale: float, host_cpus: int, host_memory: int
) -> tuple[float, int, int]:
    """(CPUs, memory in bytes, processes) for one container of ``kind`` in a pool of ``scale``."""
    if scale <= 0:
        raise ValueError(f"limits scale {scale}: must be above 0")
    cpus = min(float(host_cpus), max(MIN_CPUS, round(kind.vcpus * scale, 2)))
    memory = min(host_memory, max(MIN_MEMORY, int(kind.memory_gib * GIB * scale)))
    pids = min(MAX_PIDS, max(MIN_PIDS, round(PIDS_PER_CPU * cpus)))
    return cpus, memory, pids
