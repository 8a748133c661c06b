"""A training job that survives interruptions: logistic regression by minibatch SGD, in numpy.

It keeps to the SageMaker training contract, so it runs unchanged on SageMaker and on hyperplan:

* data: every ``*.csv`` in the ``training`` channel (``SM_CHANNEL_TRAINING``): columns x1..xN, then y;
* hyperparameters: ``SM_HPS``, overridden by command-line arguments (script mode passes ``--name value``):
  ``epochs``, ``lr``, ``seed``, ``batch_size``, and ``epoch-seconds`` (a pause per epoch that stands in
  for real work, so a demo or a test can interrupt it mid-run);
* checkpoints: ``SM_CHECKPOINT_DIR`` (set by hyperplan; on SageMaker ``/opt/ml/checkpoints``), one file
  per epoch, each written to a temporary name and then renamed, so a half-written one is never read;
* the model: ``SM_MODEL_DIR/weights.npy`` and ``SM_MODEL_DIR/summary.json``.

On SIGTERM (sent when a plan's segment is about to end) it finishes the epoch, saves its checkpoint and
exits with status 75, "interrupted, run me again", which a service can tell from 1, "failed". Run again
with the same checkpoints it carries on after the last saved epoch, and its final model is byte for byte
the one an uninterrupted run makes: a checkpoint holds the weights, the epoch and the state of the random
generator that shuffles the data.

Try it by hand::

    python examples/make_dataset.py demo/train/data.csv
    SM_CHANNEL_TRAINING=demo/train SM_CHECKPOINT_DIR=demo/ckpt SM_MODEL_DIR=demo/model \\
        python examples/train_checkpointed.py --epochs 20 --epoch-seconds 0.5
    # `kill <pid>` it half-way (a plain kill is SIGTERM), then run the same command again
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again later"
stop_requested = False


def request_stop(signum: int, frame: FrameType | None) -> None:
    global stop_requested
    stop_requested = True


def parse_hyperparameters(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--epoch-seconds", type=float, default=0.0)
    # SM_HPS holds the same hyperparameters, already decoded from JSON; arguments win over it.
    from_environment = json.loads(os.environ.get("SM_HPS", "{}"))
    parser.set_defaults(**{name.replace("-", "_"): value for name, value in from_environment.items()})
    args, _unknown = parser.parse_known_args(argv)  # hyperparameters meant for someone else are ignored
    return args


def load_training_data() -> tuple[np.ndarray, np.ndarray]:
    """Features (with a constant 1 for the bias) and labels from the training channel's CSV files."""
    channel = Path(os.environ.get("SM_CHANNEL_TRAINING", "/opt/ml/input/data/training"))
    files = sorted(channel.rglob("*.csv"))
    if not files:
        raise SystemExit(f"no .csv files in the training channel {channel}")
    data = np.vstack([np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2) for path in files])
    features = np.column_stack([data[:, :-1], np.ones(len(data))])
    return features, data[:, -1]


def predict(weights: np.ndarray, features: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(features @ weights)))


def log_loss(weights: np.ndarray, features: np.ndarray, labels: np.ndarray) -> float:
    p = np.clip(predict(weights, features), 1e-12, 1 - 1e-12)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def train_one_epoch(
    weights: np.ndarray,
    features: np.ndarray,
    labels: np.ndarray,
    hp: argparse.Namespace,
    rng: np.random.Generator,
) -> np.ndarray:
    order = rng.permutation(len(labels))
    for start in range(0, len(order), hp.batch_size):
        batch = order[start : start + hp.batch_size]
        gradient = features[batch].T @ (predict(weights, features[batch]) - labels[batch]) / len(batch)
        weights = weights - hp.lr * gradient
    return weights


def save_checkpoint(directory: Path, epoch: int, weights: np.ndarray, rng: np.random.Generator) -> None:
    path = directory / f"checkpoint-{epoch:04d}.npz"
    temp = directory / f".{path.name}.partial"
    with temp.open("wb") as out:
        np.savez(out, epoch=epoch, weights=weights, rng_state=json.dumps(rng.bit_generator.state))
    os.replace(temp, path)  # atomic: the checkpoint appears whole or not at all


def load_latest_checkpoint(directory: Path) -> tuple[int, np.ndarray, dict[str, Any]] | None:
    checkpoints = sorted(directory.glob("checkpoint-*.npz"))
    if not checkpoints:
        return None
    with np.load(checkpoints[-1]) as saved:
        return int(saved["epoch"]), saved["weights"], json.loads(str(saved["rng_state"]))


def pause(seconds: float) -> None:
    """Stand in for a long epoch; a stop request cuts it short."""
    deadline = time.monotonic() + seconds
    while not stop_requested and time.monotonic() < deadline:
        time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))


def save_model(weights: np.ndarray, summary: dict[str, Any]) -> None:
    model_dir = Path(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    model_dir.mkdir(parents=True, exist_ok=True)
    np.save(model_dir / "weights.npy", weights)
    (model_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, request_stop)
    hp = parse_hyperparameters(argv)
    features, labels = load_training_data()
    checkpoint_dir = Path(os.environ.get("SM_CHECKPOINT_DIR", "/opt/ml/checkpoints"))
    checkpoint_dir.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(hp.seed)
    weights = np.zeros(features.shape[1])
    first_epoch = 1
    restored = load_latest_checkpoint(checkpoint_dir)
    if restored is not None:
        last_epoch, weights, rng.bit_generator.state = restored
        first_epoch = last_epoch + 1
        print(f"resuming after epoch {last_epoch}", flush=True)

    for epoch in range(first_epoch, hp.epochs + 1):
        pause(hp.epoch_seconds)
        weights = train_one_epoch(weights, features, labels, hp, rng)
        save_checkpoint(checkpoint_dir, epoch, weights, rng)
        print(f"epoch {epoch}: loss {log_loss(weights, features, labels):.6f}", flush=True)
        if stop_requested and epoch < hp.epochs:
            print(f"interrupted: saved epoch {epoch}, exiting to be resumed", flush=True)
            return EXIT_INTERRUPTED

    accuracy = float(np.mean((predict(weights, features) > 0.5) == labels))
    summary = {"epochs": hp.epochs, "lr": hp.lr, "seed": hp.seed, "rows": len(labels), "accuracy": accuracy}
    save_model(weights, summary | {"loss": log_loss(weights, features, labels)})
    print(f"done: accuracy {accuracy:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
