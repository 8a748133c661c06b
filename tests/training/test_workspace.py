"""Workspaces on real files: prepare a tree, sync checkpoints, pack the model."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import StorageError
from hyperplan.training.contract import Channel, JobSpec, NoCommand
from hyperplan.training.workspace import pack_model, prepare, read_failure, sync_checkpoints


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


def tarball(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


def archive_contents(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


@pytest.fixture
def buckets(tmp_path: Path) -> Path:
    return tmp_path / "s3"


@pytest.fixture
def storage(buckets: Path) -> Storage:
    return Storage({}, buckets)


def spec(**changes: object) -> JobSpec:
    values: dict[str, object] = {
        "job_name": "job-1",
        "instance_type": "ml.m5.xlarge",
        "hosts": ("algo-1",),
        "current_host": "algo-1",
        "output_path": "s3://out/models/",
        "hyperparameters": {
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": '"s3://bkt/code/sourcedir.tar.gz"',
            "epochs": "3",
        },
        "channels": (Channel("training", "s3://bkt/data/train"),),
        "checkpoint_uri": "s3://bkt/checkpoints/job-1",
    }
    return JobSpec(**(values | changes))  # type: ignore[arg-type]


def test_prepare_builds_the_tree_and_fetches_everything(
    storage: Storage, buckets: Path, tmp_path: Path
) -> None:
    write(buckets / "bkt/data/train/part-1.csv", "1,2\n")
    write(buckets / "bkt/data/train/more/part-2.csv", "3,4\n")
    write(buckets / "bkt/checkpoints/job-1/checkpoint-0002.npz", "saved")
    write(
        buckets / "bkt/code/sourcedir.tar.gz",
        tarball({"train.py": "print('hi')\n", "lib/util.py": "X = 1\n"}),
    )
    root = tmp_path / "job"

    prepared = prepare(root, spec(), storage)

    assert prepared.channel_files == {"training": 2}
    assert prepared.restored_checkpoints == 1
    assert prepared.code_files == 2
    assert (root / "input/data/training/part-1.csv").read_text() == "1,2\n"
    assert (root / "input/data/training/more/part-2.csv").read_text() == "3,4\n"
    assert (root / "checkpoints/checkpoint-0002.npz").read_text() == "saved"
    assert (root / "code/train.py").read_text() == "print('hi')\n"
    assert (root / "code/lib/util.py").exists()
    for directory in ("model", "output/data", "output/intermediate", "input/config"):
        assert (root / directory).is_dir(), directory
    for path, content in prepared.contract.config_files().items():
        assert json.loads(path.read_text()) == content
    assert not (root / ".hyperplan" / "sourcedir.tar.gz").exists()


def test_a_missing_channel_bucket_fails_naming_the_uri(storage: Storage, tmp_path: Path) -> None:
    with pytest.raises(StorageError) as caught:
        prepare(tmp_path / "job", spec(hyperparameters={}, entrypoint=("true",)), storage)
    assert caught.value.uri == "s3://bkt/data/train"
    assert "no such bucket 'bkt'" in str(caught.value)


def test_an_empty_channel_fails_naming_the_uri(storage: Storage, buckets: Path, tmp_path: Path) -> None:
    (buckets / "bkt").mkdir(parents=True)
    with pytest.raises(StorageError, match=r"^s3://bkt/data/train: no objects found for channel 'training'"):
        prepare(tmp_path / "job", spec(hyperparameters={}, entrypoint=("true",)), storage)


def test_missing_code_fails_naming_the_uri(storage: Storage, buckets: Path, tmp_path: Path) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    with pytest.raises(StorageError, match=r"^s3://bkt/code/sourcedir.tar.gz: no such object"):
        prepare(tmp_path / "job", spec(), storage)


def test_a_code_archive_that_escapes_its_directory_is_refused(
    storage: Storage, buckets: Path, tmp_path: Path
) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    write(buckets / "bkt/code/sourcedir.tar.gz", tarball({"train.py": "", "../../escaped.txt": "gotcha"}))
    with pytest.raises(StorageError, match=r"^s3://bkt/code/sourcedir.tar.gz: cannot unpack"):
        prepare(tmp_path / "job", spec(), storage)
    assert not list(tmp_path.rglob("escaped.txt"))


def test_nothing_to_run_is_refused_before_any_io(storage: Storage, tmp_path: Path) -> None:
    with pytest.raises(NoCommand):
        prepare(tmp_path / "job", spec(hyperparameters={}), storage)
    assert not (tmp_path / "job").exists()


def test_checkpoints_sync_while_running_and_restore_on_restart(
    storage: Storage, buckets: Path, tmp_path: Path
) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    job = spec(hyperparameters={}, entrypoint=("true",))
    first = tmp_path / "first"
    prepare(first, job, storage)
    assert sync_checkpoints(first, job, storage) == 0

    write(first / "checkpoints/epoch-1.ckpt", "one")
    write(first / "checkpoints/shard/epoch-1.part", "part")
    assert sync_checkpoints(first, job, storage) == 2
    assert sync_checkpoints(first, job, storage) == 0
    write(first / "checkpoints/epoch-2.ckpt", "two")
    assert sync_checkpoints(first, job, storage) == 1
    stored = {item.key for item in storage.list("s3://bkt/checkpoints/job-1")}
    assert stored == {
        f"checkpoints/job-1/{n}" for n in ("epoch-1.ckpt", "epoch-2.ckpt", "shard/epoch-1.part")
    }

    second = tmp_path / "second"  # a restart, perhaps on another node
    assert prepare(second, job, storage).restored_checkpoints == 3
    assert (second / "checkpoints/epoch-2.ckpt").read_text() == "two"
    assert sync_checkpoints(second, job, storage) == 0  # restored files are not sent back


def test_a_job_without_checkpoint_config_syncs_nothing(
    storage: Storage, buckets: Path, tmp_path: Path
) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    job = spec(hyperparameters={}, entrypoint=("true",), checkpoint_uri=None)
    prepare(tmp_path / "job", job, storage)
    write(tmp_path / "job/checkpoints/c", "x")
    assert sync_checkpoints(tmp_path / "job", job, storage) == 0


def test_pack_model_stores_the_model_and_output_data(storage: Storage, buckets: Path, tmp_path: Path) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    job = spec(hyperparameters={}, entrypoint=("true",))
    root = tmp_path / "job"
    prepare(root, job, storage)
    write(root / "model/weights.npy", "w")
    write(root / "model/sub/config.json", "{}")
    write(root / "output/data/metrics.txt", "m")

    uri = pack_model(root, job, storage)

    assert uri == "s3://out/models/job-1/output/model.tar.gz"
    output = buckets / "out/models/job-1/output"
    assert archive_contents(output / "model.tar.gz") == {"weights.npy": "w", "sub/config.json": "{}"}
    assert archive_contents(output / "output.tar.gz") == {"metrics.txt": "m"}
    assert sorted(os.listdir(tmp_path)) == ["job", "s3"]  # the staging directory is gone


def test_an_empty_model_is_still_stored_and_empty_output_data_is_not(
    storage: Storage, buckets: Path, tmp_path: Path
) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    job = spec(hyperparameters={}, entrypoint=("true",))
    prepare(tmp_path / "job", job, storage)
    pack_model(tmp_path / "job", job, storage)
    output = buckets / "out/models/job-1/output"
    assert archive_contents(output / "model.tar.gz") == {}
    assert not (output / "output.tar.gz").exists()


def test_a_restart_on_the_same_root_keeps_checkpoints_newer_than_the_stored_ones(
    storage: Storage, buckets: Path, tmp_path: Path
) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    job = spec(hyperparameters={}, entrypoint=("true",))
    root = tmp_path / "job"
    prepare(root, job, storage)
    write(root / "checkpoints/latest.ckpt", "epoch 1")
    sync_checkpoints(root, job, storage)
    newer = write(root / "checkpoints/latest.ckpt", "epoch 2")  # written after the last sync, then it stopped
    later = newer.stat().st_mtime_ns + 1_000_000_000
    os.utime(newer, ns=(later, later))

    assert prepare(root, job, storage).restored_checkpoints == 0
    assert (root / "checkpoints/latest.ckpt").read_text() == "epoch 2"


def test_a_first_start_with_checkpoints_in_a_bucket_not_yet_written_restores_nothing(
    storage: Storage, buckets: Path, tmp_path: Path
) -> None:
    write(buckets / "bkt/data/train/x.csv", "1\n")
    job = spec(hyperparameters={}, entrypoint=("true",), checkpoint_uri="s3://new-bucket/ckpt")
    assert prepare(tmp_path / "job", job, storage).restored_checkpoints == 0
    write(tmp_path / "job/checkpoints/c", "x")
    assert sync_checkpoints(tmp_path / "job", job, storage) == 1
    assert (buckets / "new-bucket/ckpt/c").read_text() == "x"


def test_reading_the_tree_back_follows_no_link(storage: Storage, buckets: Path, tmp_path: Path) -> None:
    """The tree is the job's: what it plants there must not make the server store, or write over, a
    file outside it (here the "server's" files stand beside the tree)."""
    write(buckets / "bkt/data/train/x.csv", "1\n")
    job = spec(hyperparameters={}, entrypoint=("true",))
    root = tmp_path / "job"
    prepare(root, job, storage)
    secret = write(tmp_path / "server/master.key", "the key")
    victim = write(tmp_path / "server/credentials", "untouched")
    write(root / "model/weights.npy", "w")
    (root / "model/key").symlink_to(secret)
    (root / "model/everything").symlink_to(secret.parent, target_is_directory=True)
    os.mkfifo(root / "model/pipe")
    write(root / "checkpoints/epoch-1.ckpt", "one")
    (root / "checkpoints/key.ckpt").symlink_to(secret)
    (root / "output/failure").symlink_to(secret)
    (root / ".hyperplan").mkdir()
    (root / ".hyperplan/model.tar.gz").symlink_to(victim)  # where the archive used to be written

    assert sync_checkpoints(root, job, storage) == 1
    assert {item.key for item in storage.list("s3://bkt/checkpoints/job-1")} == {
        "checkpoints/job-1/epoch-1.ckpt"
    }
    pack_model(root, job, storage)
    with tarfile.open(buckets / "out/models/job-1/output/model.tar.gz") as tar:
        assert tar.getnames() == ["weights.npy"]
    assert read_failure(root, 100) == ""
    assert victim.read_text() == "untouched"

    (root / "output/failure").unlink()
    write(root / "output/failure", "bad input\n")
    assert read_failure(root, 100) == "bad input"
    shutil.rmtree(root / "model")
    (root / "model").symlink_to(secret.parent, target_is_directory=True)  # the whole directory a link
    pack_model(root, job, storage)
    assert archive_contents(buckets / "out/models/job-1/output/model.tar.gz") == {}
    assert sorted(os.listdir(tmp_path)) == ["job", "s3", "server"]  # no staging directory left
