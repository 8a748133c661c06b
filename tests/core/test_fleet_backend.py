"""The fleet file's [backend] table and the pools' Slurm nodes (issue 17)."""

from datetime import timedelta

import pytest

from hyperplan.core.fleet import BackendSettings
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.errors import ValidationError

ZONES = """
region = "us-west-2"
[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
"""

SLURM = """
[backend]
kind = "slurm"
slurm_conf = "/etc/slurm/slurm.conf"
partition = "gpu"
kill_grace = "90s"
"""


def pool(instance_type: str = "ml.p5.48xlarge", extra: str = "") -> str:
    head = f'[[pools]]\ninstance_type = "{instance_type}"\nzone = "us-west-2a"\n'
    return head + f'price_per_instance_hour = "9.5"\n{extra}\n'


def test_the_local_back_end_is_the_default() -> None:
    fleet = parse_fleet(ZONES + pool(extra="count = 4"))
    assert fleet.backend == BackendSettings(kind="local")
    assert fleet.pools[0].nodes == () and fleet.pools[0].feature is None
    assert (
        parse_fleet(ZONES + '[backend]\nkind = "local"\n' + pool(extra="count = 4")).backend.kind == "local"
    )


def test_a_slurm_fleet_names_its_nodes_and_features() -> None:
    fleet = parse_fleet(
        ZONES
        + SLURM
        + pool(extra='nodes = "gpu[01-04,07]"\ncount = 5\nreservable = 4')
        + pool("ml.g5.12xlarge", 'nodes = "g5a,g5b"\nfeature = "a10g"')
    )
    assert fleet.backend == BackendSettings(
        kind="slurm", slurm_conf="/etc/slurm/slurm.conf", partition="gpu", kill_grace=timedelta(seconds=90)
    )
    p5, g5 = fleet.pools
    assert p5.nodes == ("gpu01", "gpu02", "gpu03", "gpu04", "gpu07")
    assert (p5.instance_count, p5.reservable, p5.feature) == (5, 4, "ml.p5.48xlarge")  # feature: the type
    assert (g5.nodes, g5.instance_count, g5.feature) == (("g5a", "g5b"), 2, "a10g")  # count: the nodes'


def test_slurm_defaults() -> None:
    fleet = parse_fleet(
        ZONES + '[backend]\nkind = "slurm"\nslurm_conf = "/s.conf"\n' + pool(extra='nodes = "n1"')
    )
    assert fleet.backend.partition is None
    assert fleet.backend.kill_grace == timedelta(minutes=2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            ZONES + '[backend]\nkind = "k8s"\n' + pool(extra="count = 1"),
            "backend.kind: 'k8s' is not one of local, slurm",
        ),
        (
            ZONES + '[backend]\nslurm_conf = "/s"\n' + pool(extra="count = 1"),
            "backend.slurm_conf: only for a Slurm",
        ),
        (
            ZONES + '[backend]\nkind = "local"\nkill_grace = "1m"\n' + pool(extra="count = 1"),
            "backend.kill_grace: only",
        ),
        (ZONES + '[backend]\nkind = "slurm"\n' + pool(extra='nodes = "n1"'), "backend.slurm_conf: required"),
        (
            ZONES + '[backend]\nkind = "slurm"\nslurm_conf = "s.conf"\n',
            "backend.slurm_conf: 's.conf' is not an absolute",
        ),
        (ZONES + SLURM.replace('"90s"', '"soon"') + pool(extra='nodes = "n1"'), "backend.kill_grace:"),
        (
            ZONES + SLURM.replace('"90s"', '"0s"') + pool(extra='nodes = "n1"'),
            "backend.kill_grace: must be longer",
        ),
        (
            ZONES + SLURM.replace('"gpu"', '"a b"') + pool(extra='nodes = "n1"'),
            "backend.partition: 'a b' is not",
        ),
        (ZONES + SLURM + "[backend.x]\n", "backend.x: unknown key"),
        (ZONES + pool(extra='count = 1\nnodes = "n1"'), "pools[0].nodes: only for a Slurm back end"),
        (ZONES + pool(extra='count = 1\nfeature = "x"'), "pools[0].feature: only for a Slurm back end"),
        (ZONES + SLURM + pool(extra="count = 4"), "pools[0].nodes: required"),
        (ZONES + SLURM + pool(extra='nodes = "n[1-3"'), "pools[0].nodes: hostlist 'n[1-3': '[' without ']'"),
        (
            ZONES + SLURM + pool(extra='nodes = "n[1-3]"\ncount = 4'),
            "pools[0].count: 4 differs from the 3 nodes",
        ),
        (ZONES + SLURM + pool(extra='nodes = "n[1-2],n2"'), "pools[0].nodes: n2 named more than once"),
        (ZONES + SLURM + pool(extra='nodes = "n1"\nfeature = "a b"'), "pools[0].feature: 'a b' is not"),
        (
            ZONES + SLURM + pool(extra='nodes = "n[1-2]"') + pool("ml.g5.12xlarge", 'nodes = "n[2-3]"'),
            "pools[1].nodes: n2 is already in pools[0]",
        ),
    ],
)
def test_refusals_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as raised:
        parse_fleet(text)
    assert raised.value.message.startswith(message), raised.value.message
