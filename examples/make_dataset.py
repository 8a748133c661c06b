"""Write a small, deterministic CSV for train_checkpointed.py: columns x1..xN, then a label y (0 or 1).

    python examples/make_dataset.py data/train.csv --rows 256 --features 3 --seed 7

The same arguments always write the same bytes. Upload the file where a training channel will find it,
e.g. under DATA_DIR/s3/BUCKET/ (bucket BUCKET on hyperplan's default storage) or with ``aws s3 cp``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def make_dataset(rows: int, features: int, seed: int) -> np.ndarray:
    """Points around a random plane, labelled by the side they fall on, with a little label noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    plane = rng.normal(size=features)
    y = (x @ plane + 0.5 * rng.normal(size=rows) > 0).astype(float)
    return np.column_stack([x, y])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--features", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    data = make_dataset(args.rows, args.features, args.seed)
    header = ",".join([*(f"x{i}" for i in range(1, args.features + 1)), "y"])
    args.path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(
        args.path, data, fmt=["%.6f"] * args.features + ["%d"], delimiter=",", header=header, comments=""
    )


if __name__ == "__main__":
    main()
