"""The fleets of the `history` section: the bench's demo-sized fleet at 1x, the same pools with ten times
the instances at 10x, and about 2,000 nodes in 40 pools over 6 zones at 100x.

At 10x every pool's count (and reservable count) is multiplied by ten, not the pools: the calendar keeps
the same pools and slots, so a search does the same work whatever the history, and ten times the
segments still fit the pools. The 100x fleet has 40 pools (7 types, each in 5 or 6 zones) of 40 to 60
nodes each. Every fleet keeps the bench fleet's policy, quotas and rate limits (bench/fleet.toml: no
rate limit a load client would meet), so that only the fleet's size and the history change.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.server import FLEET

BIG_TYPES = (  # (instance type, price per instance-hour)
    ("ml.p5.48xlarge", "55.04"),
    ("ml.p5e.48xlarge", "62.40"),
    ("ml.p5en.48xlarge", "66.00"),
    ("ml.p4d.24xlarge", "32.77"),
    ("ml.p4de.24xlarge", "40.97"),
    ("ml.trn2.48xlarge", "44.70"),
    ("ml.trn1.32xlarge", "21.50"),
)
BIG_ZONES = 6
BIG_POOLS = 40


def fleet_file(multiple: int, directory: Path) -> Path:
    """The fleet file of a size (1, 10 or 100), written into ``directory`` (the bench's work directory)
    unless it is the bench fleet itself."""
    if multiple == 1:
        return FLEET
    text = _scaled(FLEET.read_text(), 10) if multiple == 10 else _big_fleet(FLEET.read_text())
    path = directory / f"history-fleet-{multiple}x.toml"
    path.write_text(text)
    return path


def _scaled(text: str, factor: int) -> str:
    """The bench fleet with every pool's ``count`` and ``reservable`` multiplied by ``factor``."""
    return re.sub(
        r"^(count|reservable) = (\d+)$",
        lambda found: f"{found.group(1)} = {int(found.group(2)) * factor}",
        text,
        flags=re.MULTILINE,
    )


def _big_fleet(bench_fleet: str) -> str:
    """40 pools over 6 zones, about 2,000 nodes, under the bench fleet's policy and limits."""
    zones = [f"us-east-1{letter}" for letter in "abcdef"[:BIG_ZONES]]
    parts = ['region = "us-east-1"', 'currency = "USD"', ""]
    for number, zone in enumerate(zones, start=1):
        parts += [
            "[[zones]]",
            f'name = "{zone}"',
            f'zone_id = "use1-az{number}"',
            f'subnets = ["subnet-0e0e0c0a0000000{number}"]',
            "",
        ]
    for index in range(BIG_POOLS):
        instance_type, price = BIG_TYPES[index % len(BIG_TYPES)]
        zone = zones[(index // len(BIG_TYPES) + index % len(BIG_TYPES)) % len(zones)]  # never twice
        parts += [
            "[[pools]]",
            f'instance_type = "{instance_type}"',
            f'zone = "{zone}"',
            f"count = {45 + (index * 7) % 11}",  # 45 to 55 nodes
            f'price_per_instance_hour = "{price}"',
            "",
        ]
    return "\n".join(parts) + bench_fleet[bench_fleet.index("[policy]") :]
