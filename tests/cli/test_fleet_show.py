"""`hyperplan fleet show` against a server started on a fleet file that sizes its instance types: the
overridden figures and AWS's published ones both reach the table and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import Server

FLEET = """
region = "us-west-2"

[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"

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


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """The table's rows by instance type, each cell under its column's heading."""
    lines = [line for line in text.splitlines() if line.startswith(("┃", "│"))]
    headings = [cell.strip() for cell in lines[0].strip("┃").split("┃")]
    rows = [
        dict(zip(headings, (c.strip() for c in line.strip("│").split("│")), strict=True))
        for line in lines[1:]
    ]
    return {row["Type"]: row for row in rows}


def test_fleet_show_prints_the_fleet_files_figures_and_aws_published_ones(
    server_factory: type[Server], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    server = server_factory(data_dir=tmp_path / "data", fleet=fleet).start()

    rows = table_rows(server.cli("fleet", "show", "--days", "7").stdout)
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
