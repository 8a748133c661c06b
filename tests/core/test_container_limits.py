"""A container's limits from its instance type, its pool's share and the host (core/container_limits.py),
and the fleet file's keys for containers: [backend] podman_store and node_image, a pool's limits_scale."""

from __future__ import annotations

import pytest

from hyperplan.core.container_limits import MAX_PIDS, MIN_MEMORY, MIN_PIDS, container_limits
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.instance_types import InstanceType
from hyperplan.errors import ValidationError
from tests.core.test_fleet_backend import ZONES

GIB = 2**30
P5 = InstanceType(
    "ml.p5.48xlarge", vcpus=192, memory_gib=2048, accelerators=8, accelerator_kind="NVIDIA H100"
)
SMALL = InstanceType("ml.m5.large", vcpus=2, memory_gib=8)


def pool(instance_type: str = "ml.p5.48xlarge", extra: str = "") -> str:
    head = f'[[pools]]\ninstance_type = "{instance_type}"\nzone = "us-west-2a"\ncount = 4\n'
    return head + f'price_per_instance_hour = "9.5"\n{extra}\n'


def test_a_whole_instance_on_a_host_its_size_gets_its_published_size() -> None:
    assert container_limits(SMALL, 1.0, host_cpus=2, host_memory=16 * GIB) == (2.0, 8 * GIB, 2048)


def test_a_big_type_on_a_small_host_gets_at_most_the_host() -> None:
    cpus, memory, pids = container_limits(P5, 1.0, host_cpus=2, host_memory=24 * GIB)
    assert (cpus, memory, pids) == (2.0, 24 * GIB, 2048)


def test_a_pools_share_scales_cpus_memory_and_so_processes() -> None:
    cpus, memory, pids = container_limits(P5, 0.01, host_cpus=64, host_memory=1024 * GIB)
    assert cpus == 1.92 and memory == int(2048 * GIB * 0.01) and pids == 1966


def test_floors_and_ceilings() -> None:
    tiny = container_limits(SMALL, 0.0001, host_cpus=2, host_memory=16 * GIB)
    assert tiny == (0.1, MIN_MEMORY, MIN_PIDS)
    huge = container_limits(P5, 1.0, host_cpus=512, host_memory=4096 * GIB)
    assert huge[2] == MAX_PIDS


def test_a_share_must_be_above_zero() -> None:
    with pytest.raises(ValueError, match="above 0"):
        container_limits(SMALL, 0.0, host_cpus=2, host_memory=GIB)


def test_the_fleet_file_names_the_store_the_node_image_and_each_pools_share() -> None:
    fleet = parse_fleet(
        ZONES
        + pool(extra="limits_scale = 0.25")
        + pool("ml.m5.12xlarge")
        + '[backend]\nruntime = "podman"\npodman_store = "/srv/podman"\n'
        + 'node_image = "registry.example.com/team/node:1"\nnode_disk_gb = 250\npodman_store_gb = 500\n'
    )
    assert [p.limits_scale for p in fleet.pools] == [0.25, 1.0]
    assert fleet.backend.podman_store == "/srv/podman"
    assert fleet.backend.node_image == "registry.example.com/team/node:1"
    assert (fleet.backend.node_disk_gb, parse_fleet(ZONES + pool()).backend.node_disk_gb) == (250, 100)
    assert (fleet.backend.podman_store_gb, parse_fleet(ZONES + pool()).backend.podman_store_gb) == (500, None)
    assert (fleet.backend.runtime, parse_fleet(ZONES + pool()).backend.podman_store) == ("podman", None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (pool(extra="limits_scale = 0"), "limits_scale: 0 is not above 0 and at most 1"),
        (pool(extra="limits_scale = 1.5"), "limits_scale: 1.5 is not above 0 and at most 1"),
        (pool(extra='limits_scale = "half"'), "limits_scale: 'half' is not a number"),
        (
            pool() + '[backend]\npodman_store = "relative/dir"\n',
            "podman_store: 'relative/dir' is not an absolute",
        ),
        (pool() + '[backend]\nnode_image = "Not An Image"\n', "node_image:"),
        (pool() + "[backend]\nnode_disk_gb = 0\n", "node_disk_gb: 0 is not from 1 to 16384"),
        (pool() + "[backend]\npodman_store_gb = 16385\n", "podman_store_gb: 16385 is not from 0 to 16384"),
        (pool() + '[backend]\nnode_disk_gb = "big"\n', "node_disk_gb: 'big' is not a whole number"),
    ],
)
def test_refusals_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_fleet(ZONES + text)
