"""Write a seeded synthetic workload for `hyperplan simulate` (docs/PLANNING.md) to stdout.

    python examples/planning/make_workload.py --shape philly --seed 3 > workload.csv

The defaults are the issue's workload: one pool of 64 over 8 weeks, arrivals over the first 4 weeks at
1.3 times the pool's capacity, gangs of powers of two up to half the pool, 1 to 28 days.
"""

from __future__ import annotations

import argparse
import sys

from hyperplan.core.workloads import SHAPES, WorkloadSpec, generate, write_csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default=WorkloadSpec.shape)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool-size", type=int, default=WorkloadSpec.pool_size)
    parser.add_argument("--span-days", type=int, default=WorkloadSpec.span_days)
    parser.add_argument("--arrival-days", type=int, default=WorkloadSpec.arrival_days)
    parser.add_argument("--load", type=float, default=WorkloadSpec.load)
    parser.add_argument("--max-days", type=int, default=WorkloadSpec.max_days)
    parser.add_argument("--instance-type", default=WorkloadSpec.instance_type)
    parser.add_argument("--choice", choices=("first", "cheapest", "earliest"), default="first")
    args = parser.parse_args()
    spec = WorkloadSpec(
        instance_type=args.instance_type, pool_size=args.pool_size, span_days=args.span_days,
        arrival_days=args.arrival_days, load=args.load, max_days=args.max_days, shape=args.shape,
        choice=args.choice,
    )  # fmt: skip
    sys.stdout.write(write_csv(generate(spec, args.seed)))


if __name__ == "__main__":
    main()
