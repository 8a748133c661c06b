"""A script-mode entry point, as the SageMaker Python SDK ships it: hyperparameters arrive as
command-line arguments, data in SM_CHANNEL_TRAINING, and the model goes to SM_MODEL_DIR.

With ``--hold 1`` it shows a resume: on a first start (no checkpoint in SM_CHECKPOINT_DIR) it saves one and
holds its instance until the plan's segment ends (SIGTERM); started again in the next segment with that
checkpoint, it says so and trains."""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--hold", type=int, default=0)
    args = parser.parse_args()
    if args.hold:
        hold_until_the_segment_ends()
    rows = []
    for path in sorted(Path(os.environ["SM_CHANNEL_TRAINING"]).rglob("*.csv")):
        rows += [float(line) for line in path.read_text().split() if line]
    # The "model": the scaled mean of the data, refined once per epoch.
    estimate = 0.0
    for _ in range(args.epochs):
        estimate = args.scale * sum(rows) / len(rows)
    model_dir = Path(os.environ["SM_MODEL_DIR"])
    (model_dir / "model.json").write_text(
        json.dumps({"estimate": estimate, "rows": len(rows), "hosts": json.loads(os.environ["SM_HOSTS"])})
    )
    print(f"trained on {len(rows)} rows: {estimate}", flush=True)


def hold_until_the_segment_ends() -> None:
    checkpoint = Path(os.environ["SM_CHECKPOINT_DIR"]) / "held.json"
    if checkpoint.exists():
        print(f"resuming from checkpoint {json.loads(checkpoint.read_text())}", flush=True)
        return
    checkpoint.write_text(json.dumps({"segment": 1}))
    print("first segment: checkpoint saved, holding until the segment ends", flush=True)

    def interrupted(signum: int, frame: object) -> None:
        print("interrupted by the end of the segment", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, interrupted)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
