"""Storage behind s3:// URIs, on an S3-compatible endpoint: moto's S3 server, on loopback only.

The buckets are configured as an operator would, through a parsed fleet file, and go through the same
round trips as the directory tests (test_storage.py). Access denied is real: moto checks signatures and
IAM policies while its IAM authentication is switched on.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import socket
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from hyperplan.core.fleet import S3Bucket
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.objects.s3 import MTIME_METADATA, S3Store
from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import StorageError
from hyperplan.training.contract import Channel, JobSpec
from hyperplan.training.workspace import pack_model, prepare, sync_checkpoints

pytestmark = pytest.mark.sdk  # a part of its own (tests/parts.py)

FLEET = """
region = "us-west-2"
[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
[[pools]]
instance_type = "ml.p5.48xlarge"
zone = "us-west-2a"
count = 1
price_per_instance_hour = "55.04"
"""

ADMIN_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
KEY_ENV, SECRET_ENV = "HYPERPLAN_TEST_S3_KEY_ID", "HYPERPLAN_TEST_S3_SECRET"
_names = itertools.count()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    # moto imported here, at the first test: every run collects this module, the core part's too.
    from moto.server import ThreadedMotoServer

    access_log = logging.getLogger("werkzeug")
    level = access_log.level
    access_log.setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    assert host == "127.0.0.1"  # loopback only
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        access_log.setLevel(level)


@pytest.fixture(scope="module")
def admin(endpoint: str) -> Any:
    """A client of the server's own, for setting buckets up and looking behind Storage's back."""
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **ADMIN_KEYS)


@pytest.fixture
def remote(admin: Any) -> str:
    """A fresh remote bucket per test: the server lives for the whole module."""
    name = f"remote-{next(_names)}-{os.getpid()}"
    admin.create_bucket(Bucket=name)
    return name


def s3_storage(
    tmp_path: Path,
    endpoint: str,
    remote: str,
    monkeypatch: pytest.MonkeyPatch,
    keys: tuple[str, str] = ("testing", "testing"),
) -> Storage:
    """Storage as the service builds it, from a fleet file that maps ``team-data`` to ``remote``."""
    monkeypatch.setenv(KEY_ENV, keys[0])
    monkeypatch.setenv(SECRET_ENV, keys[1])
    fleet = parse_fleet(
        FLEET
        + f"""
[buckets.team-data]
endpoint_url = "{endpoint}"
region = "us-east-1"
bucket = "{remote}"
access_key_id_env = "{KEY_ENV}"
secret_access_key_env = "{SECRET_ENV}"
"""
    )
    return Storage.in_data_dir(tmp_path / "data", fleet.buckets)


@pytest.fixture
def storage(tmp_path: Path, endpoint: str, remote: str, monkeypatch: pytest.MonkeyPatch) -> Storage:
    return s3_storage(tmp_path, endpoint, remote, monkeypatch)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def files_under(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): p.read_text()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def remote_objects(admin: Any, remote: str) -> dict[str, bytes]:
    listing = admin.list_objects_v2(Bucket=remote).get("Contents", [])
    return {item["Key"]: admin.get_object(Bucket=remote, Key=item["Key"])["Body"].read() for item in listing}


def assert_refused(attempt: Callable[[], object], uri_start: str, reason: str) -> StorageError:
    with pytest.raises(StorageError) as caught:
        attempt()
    assert caught.value.uri.startswith(uri_start), caught.value.uri
    assert str(caught.value).startswith(f"{caught.value.uri}: ")
    assert reason in caught.value.reason, caught.value.reason
    return caught.value


# --- round trips ---------------------------------------------------------------------------------------


def test_a_file_round_trips_through_the_remote_bucket(
    storage: Storage, admin: Any, remote: str, tmp_path: Path
) -> None:
    source = write(tmp_path / "src" / "data.csv", "a,b\n1,2\n")
    storage.upload_file(source, "s3://team-data/train/data.csv")
    assert remote_objects(admin, remote) == {"train/data.csv": b"a,b\n1,2\n"}
    head = admin.head_object(Bucket=remote, Key="train/data.csv")
    assert head["Metadata"] == {MTIME_METADATA: str(source.stat().st_mtime_ns)}
    assert not (tmp_path / "data" / "s3").exists()  # nothing went to the default root

    assert storage.exists("s3://team-data/train/data.csv")
    assert not storage.exists("s3://team-data/train/other.csv")
    assert not storage.exists("s3://team-data/train")  # a prefix is not an object
    assert storage.download_prefix("s3://team-data/train/data.csv", tmp_path / "one") == 1
    assert files_under(tmp_path / "one") == {"data.csv": "a,b\n1,2\n"}
    # The download carries the uploaded file's mtime, to the nanosecond.
    assert (tmp_path / "one" / "data.csv").stat().st_mtime_ns == source.stat().st_mtime_ns


def test_a_directory_round_trips_keeping_relative_paths(storage: Storage, tmp_path: Path) -> None:
    source = tmp_path / "src"
    tree = {"a.txt": "A", "sub/b.txt": "B", "sub/deeper/c.txt": "C"}
    for name, text in tree.items():
        write(source / name, text)
    assert storage.upload_dir(source, "s3://team-data/runs/1/") == 3
    listed = storage.list("s3://team-data/runs/1")
    assert [item.key for item in listed] == ["runs/1/a.txt", "runs/1/sub/b.txt", "runs/1/sub/deeper/c.txt"]
    assert listed[1].uri == "s3://team-data/runs/1/sub/b.txt"
    assert (listed[1].size, listed[1].mtime_ns) == (1, (source / "sub" / "b.txt").stat().st_mtime_ns)
    assert storage.download_prefix("s3://team-data/runs/1", tmp_path / "back") == 3
    assert files_under(tmp_path / "back") == tree


def test_a_prefix_is_a_whole_directory_and_folder_markers_are_not_objects(
    storage: Storage, admin: Any, remote: str, tmp_path: Path
) -> None:
    # Stored by another tool: no mtime metadata, and a console's "folder" marker.
    admin.put_object(Bucket=remote, Key="data/train/1.csv", Body=b"in")
    admin.put_object(Bucket=remote, Key="data/train/", Body=b"")
    admin.put_object(Bucket=remote, Key="data/training.csv", Body=b"not in")
    assert storage.download_prefix("s3://team-data/data/train", tmp_path / "d1") == 1
    assert files_under(tmp_path / "d1") == {"1.csv": "in"}
    assert storage.download_prefix("s3://team-data/data/train/", tmp_path / "d2") == 1
    assert storage.download_prefix("s3://team-data/nothing/here", tmp_path / "d3") == 0
    # Without hyperplan's metadata, an object's mtime is its upload time.
    [item] = storage.list("s3://team-data/data/train")
    assert abs(item.mtime_ns - time.time_ns()) < 120 * 10**9


def test_listing_follows_pages_in_key_order_and_shards_by_key(
    storage: Storage, admin: Any, remote: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(S3Store, "page_size", 2)
    for index in range(5):
        admin.put_object(Bucket=remote, Key=f"p/{index}.csv", Body=str(index).encode())
    assert [item.key for item in storage.list("s3://team-data/p")] == [f"p/{i}.csv" for i in range(5)]
    assert storage.download_prefix("s3://team-data/p", tmp_path / "h0", shard=(0, 2)) == 3
    assert storage.download_prefix("s3://team-data/p", tmp_path / "h1", shard=(1, 2)) == 2
    assert set(files_under(tmp_path / "h0")) == {"0.csv", "2.csv", "4.csv"}
    assert set(files_under(tmp_path / "h1")) == {"1.csv", "3.csv"}


def test_a_large_file_goes_up_in_parts_and_keeps_its_mtime(
    storage: Storage, admin: Any, remote: str, tmp_path: Path
) -> None:
    big = write(tmp_path / "model.tar.gz", os.urandom(9 << 20))  # above boto3's 8 MB multipart threshold
    storage.upload_file(big, "s3://team-data/out/model.tar.gz")
    head = admin.head_object(Bucket=remote, Key="out/model.tar.gz")
    assert "-" in head["ETag"]  # a multipart upload's ETag
    assert head["Metadata"] == {MTIME_METADATA: str(big.stat().st_mtime_ns)}
    storage.download_file("s3://team-data/out/model.tar.gz", tmp_path / "back.tar.gz")
    assert (tmp_path / "back.tar.gz").read_bytes() == big.read_bytes()


def test_a_training_job_workspace_moves_everything_through_the_endpoint(
    storage: Storage, admin: Any, remote: str, tmp_path: Path
) -> None:
    code = io.BytesIO()
    with tarfile.open(fileobj=code, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"1+1"))
    admin.put_object(Bucket=remote, Key="code/sourcedir.tar.gz", Body=code.getvalue())
    admin.put_object(Bucket=remote, Key="data/train/part-1.csv", Body=b"1,2\n")
    job = JobSpec(
        job_name="job-1",
        instance_type="ml.m5.xlarge",
        hosts=("algo-1",),
        current_host="algo-1",
        output_path="s3://team-data/models/",
        hyperparameters={
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": '"s3://team-data/code/sourcedir.tar.gz"',
        },
        channels=(Channel("training", "s3://team-data/data/train"),),
        checkpoint_uri="s3://team-data/checkpoints/job-1",
    )
    root = tmp_path / "job"
    prepared = prepare(root, job, storage)
    assert (prepared.channel_files, prepared.restored_checkpoints, prepared.code_files) == (
        {"training": 1},
        0,
        1,
    )
    assert (root / "input/data/training/part-1.csv").read_text() == "1,2\n"

    write(root / "checkpoints" / "step-1.npz", "weights")
    assert sync_checkpoints(root, job, storage) == 1
    assert sync_checkpoints(root, job, storage) == 0
    write(root / "model" / "model.bin", "model")
    assert pack_model(root, job, storage) == "s3://team-data/models/job-1/output/model.tar.gz"
    assert set(remote_objects(admin, remote)) == {
        "code/sourcedir.tar.gz",
        "data/train/part-1.csv",
        "checkpoints/job-1/step-1.npz",
        "models/job-1/output/model.tar.gz",
    }


# --- sync ----------------------------------------------------------------------------------------------


def test_sync_uploads_only_new_and_changed_files(
    storage: Storage, admin: Any, remote: str, tmp_path: Path
) -> None:
    local = tmp_path / "ckpt"
    write(local / "a.npz", "aaaa")
    write(local / "nested" / "b.npz", "bbbb")
    assert storage.sync_dir_to(local, "s3://team-data/ckpt") == 2
    assert storage.sync_dir_to(local, "s3://team-data/ckpt") == 0

    changed = write(local / "a.npz", "AAAA")  # same size, new content, newer mtime
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    write(local / "c.npz", "c")
    assert storage.sync_dir_to(local, "s3://team-data/ckpt") == 2
    assert remote_objects(admin, remote) == {
        "ckpt/a.npz": b"AAAA",
        "ckpt/nested/b.npz": b"bbbb",
        "ckpt/c.npz": b"c",
    }

    # What was downloaded keeps the stored mtime, so syncing it back uploads nothing.
    restored = tmp_path / "restored"
    storage.download_prefix("s3://team-data/ckpt", restored)
    assert storage.sync_dir_to(restored, "s3://team-data/ckpt") == 0

    # Deleting locally deletes nothing stored.
    (local / "c.npz").unlink()
    assert storage.sync_dir_to(local, "s3://team-data/ckpt") == 0
    assert "ckpt/c.npz" in remote_objects(admin, remote)


def test_sync_from_storage_fetches_only_what_is_missing_or_older_locally(
    storage: Storage, tmp_path: Path
) -> None:
    stored = tmp_path / "stored"
    write(stored / "old.npz", "stored old")
    write(stored / "new.npz", "stored new")
    storage.upload_dir(stored, "s3://team-data/ckpt")
    local = tmp_path / "local"
    assert storage.sync_dir_from("s3://team-data/ckpt", local) == 2
    assert storage.sync_dir_from("s3://team-data/ckpt", local) == 0

    newer_locally = write(local / "old.npz", "written since")
    later = (stored / "old.npz").stat().st_mtime_ns + 1_000_000_000
    os.utime(newer_locally, ns=(later, later))
    (local / "new.npz").unlink()
    assert storage.sync_dir_from("s3://team-data/ckpt", local) == 1
    assert files_under(local) == {"old.npz": "written since", "new.npz": "stored new"}


# --- refusals ------------------------------------------------------------------------------------------


def test_traversal_is_refused_both_in_uris_and_in_keys_other_tools_stored(
    storage: Storage, admin: Any, remote: str, tmp_path: Path
) -> None:
    source = write(tmp_path / "src" / "f.txt", "x")
    for attempt in (
        lambda: storage.upload_file(source, "s3://team-data/../escape.txt"),
        lambda: storage.upload_dir(source.parent, "s3://team-data/x/../../escape"),
        lambda: storage.download_prefix("s3://team-data/../../etc", tmp_path / "dest"),
        lambda: storage.exists("s3://team-data/../x"),
    ):
        with pytest.raises(StorageError, match=r"'\.\.' path segment"):
            attempt()
    assert remote_objects(admin, remote) == {}

    # S3 allows any key; one that would leave the download directory is refused, naming it.
    admin.put_object(Bucket=remote, Key="data/../../escape.txt", Body=b"x")
    assert_refused(
        lambda: storage.download_prefix("s3://team-data/data", tmp_path / "d" / "e"),
        "s3://team-data/data/../../escape.txt",
        "'..' path segment",
    )
    assert not (tmp_path / "escape.txt").exists()


def test_a_missing_remote_bucket_names_the_uri(
    tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = s3_storage(tmp_path, endpoint, "never-created", monkeypatch)
    source = write(tmp_path / "f.txt", "x")
    for attempt, uri in (
        (lambda: storage.download_prefix("s3://team-data/data", tmp_path / "d"), "s3://team-data/data"),
        (lambda: storage.list("s3://team-data/data"), "s3://team-data/data"),
        (lambda: storage.exists("s3://team-data/data/x"), "s3://team-data/data/x"),
        (
            lambda: storage.download_file("s3://team-data/code.tar.gz", tmp_path / "c"),
            "s3://team-data/code.tar.gz",
        ),
        (lambda: storage.upload_file(source, "s3://team-data/out/f.txt"), "s3://team-data/out/f.txt"),
        (lambda: storage.sync_dir_to(tmp_path, "s3://team-data/ckpt"), "s3://team-data/ckpt/f.txt"),
        # Unlike a default-root bucket, a configured one that is missing is an error even to restore from.
        (lambda: storage.sync_dir_from("s3://team-data/ckpt", tmp_path / "r"), "s3://team-data/ckpt"),
    ):
        error = assert_refused(attempt, uri, f"no such bucket 'never-created' at {endpoint}")
        assert error.uri == uri


def test_a_missing_object_is_named(storage: Storage, tmp_path: Path) -> None:
    error = assert_refused(
        lambda: storage.download_file("s3://team-data/code/sourcedir.tar.gz", tmp_path / "x.tar.gz"),
        "s3://team-data/code/sourcedir.tar.gz",
        "no such object",
    )
    assert str(error) == "s3://team-data/code/sourcedir.tar.gz: no such object"
    assert not (tmp_path / "x.tar.gz").exists()


@pytest.fixture
def powerless_keys(endpoint: str) -> tuple[str, str]:
    """Valid credentials of an IAM user that no policy allows anything."""
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", **ADMIN_KEYS)
    user = f"powerless-{next(_names)}"
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def test_access_denied_names_the_uri(
    tmp_path: Path,
    endpoint: str,
    admin: Any,
    remote: str,
    powerless_keys: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin.put_object(Bucket=remote, Key="data/1.csv", Body=b"x")
    source = write(tmp_path / "f.txt", "x")
    from moto.core.authorization import enable_iam_authentication

    storage = s3_storage(tmp_path, endpoint, remote, monkeypatch, keys=powerless_keys)
    with enable_iam_authentication():
        for attempt, uri in (
            (lambda: storage.download_prefix("s3://team-data/data", tmp_path / "d"), "s3://team-data/data"),
            (lambda: storage.exists("s3://team-data/data/1.csv"), "s3://team-data/data/1.csv"),
            (
                lambda: storage.download_file("s3://team-data/data/1.csv", tmp_path / "c"),
                "s3://team-data/data/1.csv",
            ),
            (lambda: storage.upload_file(source, "s3://team-data/out/f.txt"), "s3://team-data/out/f.txt"),
        ):
            error = assert_refused(attempt, uri, "access denied")
            assert error.uri == uri

        # Keys the endpoint does not know are refused the same way, saying why.
        strangers = s3_storage(tmp_path, endpoint, remote, monkeypatch, keys=("AKIAUNKNOWNUNKNOWN00", "x"))
        assert_refused(
            lambda: strangers.list("s3://team-data/data"),
            "s3://team-data/data",
            "access denied (The AWS Access Key Id",
        )


def test_an_unreachable_endpoint_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a loopback port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    storage = s3_storage(tmp_path, dead, "anything", monkeypatch)
    started = time.monotonic()
    assert_refused(lambda: storage.list("s3://team-data/data"), "s3://team-data/data", f"cannot reach {dead}")
    assert time.monotonic() - started < 10  # a few quick retries, not botocore's minute-long waits


def test_credentials_named_by_an_unset_variable_are_an_error_naming_the_uri(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV)
    assert_refused(
        lambda: storage.list("s3://team-data/data"),
        "s3://team-data/data",
        f"the environment variable {SECRET_ENV}, which holds the bucket's credentials, is not set",
    )


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        ("SignatureDoesNotMatch", 403, "access denied (SignatureDoesNotMatch message)"),
        ("AccountProblem", 403, "access denied (AccountProblem message)"),
        ("Unauthorized", 401, "access denied (Unauthorized message)"),
        ("NoSuchBucket", 404, "no such bucket 'remote-name' at http://127.0.0.1:9"),
        ("InternalError", 500, "InternalError: InternalError message"),
    ],
)
def test_error_answers_that_moto_does_not_give_map_too(code: str, status: int, reason: str) -> None:
    """Only the mapping of error answers is checked here, on a stubbed client: no request is made."""
    client = boto3.client("s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1", **ADMIN_KEYS)
    backend = S3Store("team-data", S3Bucket("http://127.0.0.1:9", "us-east-1", "remote-name"), client)
    with Stubber(client) as stub:
        stub.add_client_error("list_objects_v2", code, f"{code} message", status)
        error = assert_refused(lambda: list(backend.objects_under("data")), "s3://team-data/data", reason)
    assert str(error) == f"s3://team-data/data: {reason}"
