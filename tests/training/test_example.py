"""The example training job, run for real as processes with the environment the contract builds.

A run that is interrupted (SIGTERM mid-way), stored, and restarted on a fresh tree from its synced
checkpoints must end with the same model, byte for byte, as a run that was never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperplan.backends.layout import inherited_mark
from hyperplan.objects.storage import Storage
from hyperplan.training.contract import Channel, JobSpec, host_names
from hyperplan.training.workspace import pack_model, prepare, sync_checkpoints

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXIT_INTERRUPTED = 75
EPOCHS = 8
BASE_ENVIRONMENT = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


@dataclass
class Run:
    returncode: int
    stdout: str
    synced_while_running: int


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Storage:
    """A bucket holding the dataset and the example's code, as the SageMaker SDK would upload them."""
    work = tmp_path_factory.mktemp("example")
    storage = Storage({}, work / "s3")
    dataset = work / "data.csv"
    subprocess.run([sys.executable, EXAMPLES / "make_dataset.py", dataset, "--rows", "300"], check=True)
    storage.upload_file(dataset, "s3://bucket/data/train/data.csv")
    sourcedir = work / "sourcedir.tar.gz"
    with tarfile.open(sourcedir, "w:gz") as tar:
        tar.add(EXAMPLES / "train_checkpointed.py", arcname="train_checkpointed.py")
    storage.upload_file(sourcedir, "s3://bucket/code/sourcedir.tar.gz")
    return storage


def script_mode_job(name: str, epoch_seconds: float) -> JobSpec:
    hyperparameters = {  # JSON-encoded, as the SDK sends them
        "sagemaker_program": json.dumps("train_checkpointed.py"),
        "sagemaker_submit_directory": json.dumps("s3://bucket/code/sourcedir.tar.gz"),
        "epochs": json.dumps(EPOCHS),
        "lr": json.dumps(0.2),
        "seed": json.dumps(11),
        "epoch-seconds": json.dumps(epoch_seconds),
    }
    return JobSpec(
        job_name=name,
        instance_type="ml.m5.xlarge",
        hosts=("algo-1",),
        current_host="algo-1",
        output_path="s3://bucket/output",
        hyperparameters=hyperparameters,
        channels=(Channel("training", "s3://bucket/data/train", content_type="text/csv"),),
        checkpoint_uri=f"s3://bucket/checkpoints/{name}",
        segment_end_epoch=int(time.time()) + 3600,
    )


def run_instance(
    root: Path, spec: JobSpec, storage: Storage, interrupt_after_epochs: int | None = None
) -> Run:
    """What a runner does: prepare, start, sync checkpoints while it runs (and SIGTERM it if asked), sync
    once more at the end, and store the model of a successful run."""
    contract = prepare(root, spec, storage).contract
    process = subprocess.Popen(
        contract.command.argv,
        cwd=contract.command.cwd,
        env=contract.process_environment({**BASE_ENVIRONMENT, **inherited_mark()}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    synced = 0
    try:
        deadline = time.monotonic() + 20
        while process.poll() is None and time.monotonic() < deadline:
            synced += sync_checkpoints(root, spec, storage)
            done = len(list(contract.layout.checkpoint_dir.glob("checkpoint-*.npz")))
            if interrupt_after_epochs is not None and done >= interrupt_after_epochs:
                process.send_signal(signal.SIGTERM)
                interrupt_after_epochs = None
            time.sleep(0.02)
        stdout, _ = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    sync_checkpoints(root, spec, storage)
    if process.returncode == 0:
        pack_model(root, spec, storage)
    return Run(process.returncode, stdout, synced)


def stored_model(storage: Storage, job_name: str, dest: Path) -> dict[str, bytes]:
    storage.download_file(f"s3://bucket/output/{job_name}/output/model.tar.gz", dest / "model.tar.gz")
    with tarfile.open(dest / "model.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_an_interrupted_and_resumed_run_ends_with_the_same_model(storage: Storage, tmp_path: Path) -> None:
    plain = run_instance(tmp_path / "plain", script_mode_job("plain", 0.0), storage)
    assert plain.returncode == 0, plain.stdout
    assert plain.stdout.count("epoch ") == EPOCHS

    job = script_mode_job("resumed", 0.15)
    interrupted = run_instance(tmp_path / "attempt-1", job, storage, interrupt_after_epochs=2)
    assert interrupted.returncode == EXIT_INTERRUPTED, interrupted.stdout
    assert "interrupted: saved epoch" in interrupted.stdout
    # (a sync may also catch the example's temporary ".partial" file, which it ignores when it resumes)
    stored = [item for item in storage.list("s3://bucket/checkpoints/resumed") if item.key.endswith(".npz")]
    assert 2 <= len(stored) < EPOCHS
    assert interrupted.synced_while_running > 0
    assert not storage.exists("s3://bucket/output/resumed/output/model.tar.gz")

    resumed = run_instance(
        tmp_path / "attempt-2", job, storage
    )  # a fresh tree: checkpoints come from storage
    assert resumed.returncode == 0, resumed.stdout
    assert f"resuming after epoch {len(stored)}" in resumed.stdout

    expected = stored_model(storage, "plain", tmp_path / "plain-model")
    actual = stored_model(storage, "resumed", tmp_path / "resumed-model")
    assert set(expected) == {"weights.npy", "summary.json"}
    assert actual == expected
    assert json.loads(expected["summary.json"])["accuracy"] > 0.8


def test_each_host_of_a_two_host_job_knows_both_hosts_and_itself(storage: Storage, tmp_path: Path) -> None:
    report = "import os; print(os.environ['SM_HOSTS']); print(os.environ['SM_CURRENT_HOST'])"
    seen = []
    for host in host_names(2):
        spec = JobSpec(
            job_name="pair",
            instance_type="ml.m5.xlarge",
            hosts=host_names(2),
            current_host=host,
            output_path="s3://bucket/output",
            channels=(Channel("training", "s3://bucket/data/train"),),
            entrypoint=("python3", "-c", report),
            interpreter=sys.executable,
        )
        contract = prepare(tmp_path / host, spec, storage).contract
        done = subprocess.run(
            contract.command.argv,
            cwd=contract.command.cwd,
            env=contract.process_environment({**BASE_ENVIRONMENT, **inherited_mark()}),
            capture_output=True,
            text=True,
            check=True,
        )
        seen.append(done.stdout.splitlines())
    assert seen == [['["algo-1","algo-2"]', "algo-1"], ['["algo-1","algo-2"]', "algo-2"]]
