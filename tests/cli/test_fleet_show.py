"""`hyperplan fleet show` against a server started on a fleet file that sizes its instance types: the
overridden figures and AWS's published ones both reach the table and the JSON; and each zone's subnets,
which a HyperPod cluster's VpcConfig names, are listed under the pools."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import Server

FLEET = """
region = "us-west-2"

[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]

[[zones]]
name = "us-west-2b"
zone_id = "usw2-az2"

[[pools]]
instance_type = "ml.p5.48xlarge"
zone = "us-west-2a"
count = 8
price_per_instance_hour = "50.00"

[[pools]]
instance_type = "ml.m5.12xlarge"
zone = "us-west-2a"
count = 4
reservable = 0
price_per_instance_hour = "2.50"

[[pools]]
instance_type = "ml.g6.12xlarge"
zone = "us-west-2a"
count = 2
price_per_instance_hour = "4.60"

[instance_types."ml.p5.48xlarge"]   # overridden: the rest as AWS publishes
memory_gib = 1900
accelerators = 4

[instance_types."ml.g6.12xlarge"]   # not in the built-in catalogue: sized here
vcpus = 48
memory_gib = 192
accelerators = 4
accelerator_kind = "NVIDIA L4"
"""


def tables(text: str) -> list[list[dict[str, str]]]:
    """Each table printed, as its lines (a cell over several lines is several rows here), each cell under
    its column's heading."""
    found: list[list[dict[str, str]]] = []
    headings: list[str] = []
    for line in text.splitlines():
        if line.startswith("┏"):
            found.append([])
            headings = []
        elif line.startswith("┃") and not headings:
            headings = [cell.strip() for cell in line.strip("┃").split("┃")]
        elif line.startswith("│"):
            cells = (cell.strip() for cell in line.strip("│").split("│"))
            found[-1].append(dict(zip(headings, cells, strict=True)))
    return found


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """The pools' table's rows by instance type."""
    return {row["Type"]: row for row in tables(text)[0]}


def test_fleet_show_prints_the_fleet_files_figures_and_aws_published_ones(
    server_factory: type[Server], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    server = server_factory(data_dir=tmp_path / "data", fleet=fleet).start()

    shown = server.cli("fleet", "show", "--days", "7").stdout
    rows = table_rows(shown)
    sizes = {name: (r["vCPUs"], r["Memory GiB"], r["Accelerators"]) for name, r in rows.items()}
    assert sizes == {
        "ml.p5.48xlarge": ("192", "1900", "4 x NVIDIA H100"),  # vCPUs and kind published, the rest given
        "ml.m5.12xlarge": ("48", "192", "none"),  # all published
        "ml.g6.12xlarge": ("48", "192", "4 x NVIDIA L4"),  # all given
    }

    pools = json.loads(server.cli("fleet", "show", "--json").stdout)
    assert [(p["InstanceType"], p["InstanceCount"], p["PricePerInstanceHour"]) for p in pools] == [
        ("ml.p5.48xlarge", 8, "50.00"),
        ("ml.m5.12xlarge", 4, "2.50"),
        ("ml.g6.12xlarge", 2, "4.60"),
    ]  # the pools as before, with each type's size added
    figures = [(p["VCpus"], p["MemoryGiB"], p["Accelerators"], p["AcceleratorKind"]) for p in pools]
    assert figures == [(192, 1900, 4, "NVIDIA H100"), (48, 192, 0, None), (48, 192, 4, "NVIDIA L4")]

    # Under the pools, each zone and the subnets a cluster names to be there, one a line.
    zones = [(r["Zone"], r["Zone id"], r["Subnets"]) for r in tables(shown)[1]]
    assert zones == [
        ("us-west-2a", "usw2-az1", "subnet-0123456789abcdef0"),
        ("", "", "subnet-0123456789abcdef1"),
        ("us-west-2b", "usw2-az2", "(none)"),
    ]
