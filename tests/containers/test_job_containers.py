"""Training jobs in containers (runtime podman), tried from outside as a team would: boto3 against a real
server, images pulled from a real registry on loopback, real Podman containers.

One server per module, as root in isolation mode users, whose fleet names the registry of this session
(tests/containers/conftest.py), a Podman store of this worker, and an instance type small enough to
meet its limits (1 CPU, 512 MiB). Each test makes its own accounts and jobs. At the end every container
and pod of the store goes, and so do the OS users the server made.
"""

from __future__ import annotations

import importlib
import io
import json
import shutil
import tarfile
import textwrap
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends import disks
from hyperplan.containers.podman import PodmanStore
from hyperplan.signing import Credentials
from tests.containers.conftest import CONTAINED_FLEET, Built, contained_server, push_image
from tests.harness import Server, wait_until

pytestmark = pytest.mark.containers

TYPE = "ml.m5.12xlarge"
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"


@pytest.fixture(scope="module")
def server(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = PodmanStore(tmp_path_factory.mktemp("server-store"))
    fleet = CONTAINED_FLEET.format(
        store=store.root, store_gb=2, registry=built.registry, node_image=built.python
    )
    with contained_server(store, fleet) as server:
        channel = server.data_dir / "s3" / "bucket" / "input"
        channel.mkdir(parents=True)
        (channel / "data.csv").write_text("1,2\n3,4\n")
        (server.data_dir / "s3" / "lifecycle").mkdir()
        for bucket in ("bucket", "lifecycle"):
            server.native().post(f"/api/v1/buckets/{bucket}/grants", {"Account": "*", "ReadOnly": True})
        yield server


def _job(server: Server, name: str, image: str, program: str | None = None, **extra: Any) -> dict[str, Any]:
    """A job of one instance; ``program`` is its Python, put in a channel of its own (``code``) and run
    with the image's python3."""
    algorithm: dict[str, Any] = {"TrainingInputMode": "File", "TrainingImage": image}
    channels = [_channel("training", "s3://bucket/input")]
    if program is not None:
        code = server.data_dir / "s3" / "bucket" / "code" / name
        code.mkdir(parents=True)
        (code / "main.py").write_text(textwrap.dedent(program))
        channels.append(_channel("code", f"s3://bucket/code/{name}"))
        algorithm["ContainerEntrypoint"] = ["python3", "/opt/ml/input/data/code/main.py"]
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": algorithm,
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": f"s3://out-{name}/output"},
        "ResourceConfig": {"InstanceType": TYPE, "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        **extra,
    }


def _channel(name: str, uri: str) -> dict[str, Any]:
    return {"ChannelName": name, "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri}}}


def _ended(server: Server, credentials: Credentials, name: str, timeout: float = 180) -> dict[str, Any]:
    client = server.sagemaker(credentials)
    final = ("Completed", "Failed", "Stopped")
    job = wait_until(
        lambda: (d := client.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] in final and d,
        timeout=timeout,
    )
    assert job, f"{name} did not end:\n{server.log()[-3000:]}"
    return dict(job)


def _model_files(server: Server, name: str) -> dict[str, bytes]:
    archive = server.data_dir / "s3" / f"out-{name}" / "output" / name / "output" / "model.tar.gz"
    with tarfile.open(fileobj=io.BytesIO(archive.read_bytes())) as tar:
        return {
            member.name.removeprefix("./"): tar.extractfile(member).read()  # type: ignore[union-attr]
            for member in tar.getmembers()
            if member.isfile()
        }


LISTENER = """
import os, signal, socket, sys
# What another account's job must not reach: a port, /tmp, /dev/shm.
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 18765))
server.listen()
for directory in ("/tmp", "/dev/shm"):
    with open(os.path.join(directory, "alpha-secret"), "w") as secret:
        secret.write("alpha's")
with open("/opt/ml/model/alpha.txt", "w") as model:
    model.write("listened")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # StopTrainingJob ends it
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""

PROBE = """
import json, os, socket, urllib.request
seen = {}
try:
    socket.create_connection(("127.0.0.1", 18765), timeout=3).close()
    seen["port"] = "connected"
except OSError as error:
    seen["port"] = type(error).__name__
seen["files"] = [p for p in ("/tmp/alpha-secret", "/dev/shm/alpha-secret") if os.path.exists(p)]
commands = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            commands.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
        except OSError:
            pass
seen["processes"] = len(commands)
seen["sees_alpha"] = any("18765" in command for command in commands)
seen["uid_map"] = open("/proc/self/uid_map").read().split()
seen["user"] = os.getuid()
seen["data"] = open("/opt/ml/input/data/training/data.csv").read()
seen["hosts"] = json.load(open("/opt/ml/input/config/resourceconfig.json"))["hosts"]
seen["endpoint"] = os.environ.get("AWS_ENDPOINT_URL")
seen["model_dir"] = os.environ.get("SM_MODEL_DIR")
# The endpoint, through the pod's relay: the answer of the S3 API on the server's port.
try:
    urllib.request.urlopen(os.environ["AWS_ENDPOINT_URL"] + "/", timeout=10)
except urllib.error.HTTPError as answer:
    seen["endpoint_answer"] = answer.code
with open("/opt/ml/model/seen.json", "w") as model:
    json.dump(seen, model)
"""


def _stdout(server: Server, credentials: Credentials, name: str) -> str:
    try:
        answer = server.native(credentials).get(f"/api/v1/training-jobs/{name}/logs?stream=stdout")
    except Exception:  # not started yet
        return ""
    return str(answer["Data"])


def test_two_accounts_jobs_cannot_reach_each_others_ports_processes_or_scratch(
    server: Server, built: Built
) -> None:
    health = json.loads(urllib.request.urlopen(f"{server.url}/healthz", timeout=10).read())
    assert (health["runtime"], health["contained"]) == ("podman", True)
    assert "NOT contained" not in server.log()
    alpha, beta = server.new_account("alpha"), server.new_account("beta")
    server.sagemaker(alpha).create_training_job(**_job(server, "alpha-listener", built.python, LISTENER))
    assert wait_until(lambda: "listening" in _stdout(server, alpha, "alpha-listener"), timeout=120), (
        server.log()[-3000:]
    )
    server.sagemaker(beta).create_training_job(**_job(server, "beta-probe", built.python, PROBE))
    assert _ended(server, beta, "beta-probe")["TrainingJobStatus"] == "Completed"
    server.sagemaker(alpha).stop_training_job(TrainingJobName="alpha-listener")
    assert _ended(server, alpha, "alpha-listener")["TrainingJobStatus"] == "Stopped"
    seen = json.loads(_model_files(server, "beta-probe")["seen.json"])
    assert seen["port"] == "ConnectionRefusedError"  # alpha listens in its own pod's network
    assert seen["files"] == []
    assert not seen["sees_alpha"] and seen["processes"] <= 2  # the container's init and the probe
    assert seen["user"] == 0 and seen["uid_map"][:2] == ["0", seen["uid_map"][1]]
    assert int(seen["uid_map"][1]) >= 2**20  # root inside is a subordinate id outside, not root
    assert seen["data"] == "1,2\n3,4\n"
    assert seen["hosts"] == ["algo-1"]
    assert seen["model_dir"] == "/opt/ml/model"
    assert seen["endpoint"] == f"http://127.0.0.1:{server.port}"
    assert seen["endpoint_answer"] == 403  # S3 without credentials: the server answered
    assert _model_files(server, "alpha-listener")["alpha.txt"] == b"listened"


TRAIN = """#!/usr/bin/python3
# An image's own `train`, as SageMaker runs it: no entry point in the job, the image decides.
import json, os, sys
hyperparameters = json.load(open("/opt/ml/input/config/hyperparameters.json"))
marker = open("/etc/hyperplan-test-marker").read()
with open("/opt/ml/model/model.txt", "w") as model:
    model.write(f"{os.path.basename(sys.argv[0])} {hyperparameters['message']} {marker}")
"""


# boto3 and what it needs, pure Python, copied from this interpreter's site-packages (the image's Python is
# Debian's 3.11, the same minor version): an image gets them offline.
BOTO3 = ("boto3", "botocore", "jmespath", "dateutil", "s3transfer", "urllib3", "six")


@pytest.fixture(scope="module")
def marked_image(built: Built, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An image of this module: the Python image with a `train` of its own, a file the host lacks, and
    boto3."""
    context = tmp_path_factory.mktemp("marked-context")
    (context / "train").write_text(TRAIN)
    (context / "train").chmod(0o755)
    (context / "marker").write_text("from-the-image")
    packages = context / "packages"
    packages.mkdir()
    for name in BOTO3:
        module = importlib.import_module(name)
        source = Path(module.__file__ or "")
        if source.name == "__init__.py":
            shutil.copytree(source.parent, packages / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(source, packages / source.name)
    (context / "Containerfile").write_text(
        f"FROM {built.python}\nCOPY train /usr/local/bin/train\nCOPY marker /etc/hyperplan-test-marker\n"
        "COPY packages /usr/local/lib/python3.11/dist-packages\n"
    )
    return push_image(built, context, "marked:1", tmp_path_factory)


def test_an_image_without_an_entry_point_runs_its_own_train_and_its_model_lands_in_s3(
    server: Server, marked_image: str
) -> None:
    assert not Path("/etc/hyperplan-test-marker").exists()  # the image's, not the host's
    team = server.new_account("image-team")
    job = _job(server, "own-train", marked_image, HyperParameters={"message": "hello"})
    server.sagemaker(team).create_training_job(**job)
    ended = _ended(server, team, "own-train")
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")
    assert _model_files(server, "own-train")["model.txt"] == b"train hello from-the-image"
    view = server.native(team).get("/api/v1/training-jobs/own-train")
    assert view["ImageDigest"].startswith("sha256:")
    messages = [t.get("StatusMessage", "") for t in ended["SecondaryStatusTransitions"]]
    assert any(view["ImageDigest"] in message for message in messages), messages


def test_an_image_that_does_not_exist_fails_the_job_naming_it_before_any_instance_starts(
    server: Server, built: Built
) -> None:
    team = server.new_account("missing-image-team")
    missing = f"{built.registry}/hyperplan/no-such-image:1"
    server.sagemaker(team).create_training_job(**_job(server, "no-image", missing, "print('never')"))
    ended = _ended(server, team, "no-image")
    assert ended["TrainingJobStatus"] == "Failed"
    assert ended["FailureReason"].startswith("ClientError: the training image"), ended["FailureReason"]
    assert missing in ended["FailureReason"]
    assert "TrainingStartTime" not in ended  # no instance ever ran
    assert ended.get("BillableTimeInSeconds", 0) == 0


TWO_HOSTS = """
import json, os, socket, time
current = json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"]
if current == "algo-1":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 17000))
    server.listen()
    peer, _ = server.accept()
    heard = peer.recv(100).decode()
    peer.sendall(b"hi algo-2")
    with open("/opt/ml/model/heard.txt", "w") as model:
        model.write(heard + " | " + open("/opt/ml/input/data/training/data.csv").read())
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            peer = socket.create_connection(("algo-1", 17000), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    peer.sendall(b"hello from " + current.encode())
    assert peer.recv(100) == b"hi algo-2"
"""


def test_a_jobs_two_instances_reach_each_other_as_algo_1_and_algo_2(server: Server, built: Built) -> None:
    team = server.new_account("pair-team")
    job = _job(server, "pair", built.python, TWO_HOSTS)
    job["ResourceConfig"]["InstanceCount"] = 2
    server.sagemaker(team).create_training_job(**job)
    ended = _ended(server, team, "pair")
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")
    assert _model_files(server, "pair")["heard.txt"] == b"hello from algo-2 | 1,2\n3,4\n"


HOG = """
chunks = []
for _ in range(64):  # 1 GiB in 16 MiB steps: twice the container's limit
    chunks.append(bytearray(16 * 2**20))
print("never here")
"""

FORK_BOMB = """
import os, json
children = []
try:
    while len(children) < 5000:
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/sleep", ["sleep", "600"])
        children.append(pid)
except OSError as error:
    stopped = type(error).__name__
for pid in children:
    os.kill(pid, 9)
for pid in children:
    os.waitpid(pid, 0)
with open("/opt/ml/model/forks.json", "w") as model:
    json.dump({"forks": len(children), "stopped": stopped}, model)
"""


def test_a_memory_hog_fails_out_of_memory_and_a_fork_bomb_meets_its_limit_while_others_go_on(
    server: Server, built: Built
) -> None:
    hog, bomb, quiet = (server.new_account(name) for name in ("hog", "bomb", "quiet"))
    server.sagemaker(hog).create_training_job(**_job(server, "hog", built.python, HOG))
    server.sagemaker(bomb).create_training_job(**_job(server, "bomb", built.python, FORK_BOMB))
    server.sagemaker(quiet).create_training_job(
        **_job(server, "quiet", built.python, "open('/opt/ml/model/ok.txt', 'w').write('ok')")
    )
    for name, credentials in (("quiet", quiet), ("bomb", bomb), ("hog", hog)):
        _ended(server, credentials, name)
        assert server.sagemaker(quiet).list_training_jobs()["TrainingJobSummaries"] is not None  # answers
    hogged = server.sagemaker(hog).describe_training_job(TrainingJobName="hog")
    assert hogged["TrainingJobStatus"] == "Failed"
    assert hogged["FailureReason"].startswith("OutOfMemoryError: instance algo-1 ran out of memory")
    bombed = server.sagemaker(bomb).describe_training_job(TrainingJobName="bomb")
    assert bombed["TrainingJobStatus"] == "Completed", bombed.get("FailureReason")
    forks = json.loads(_model_files(server, "bomb")["forks.json"])
    assert forks["stopped"] == "BlockingIOError" and forks["forks"] < 1024  # the container's process limit
    assert _model_files(server, "quiet")["ok.txt"] == b"ok"


FILL = """
import errno, json, os
ml, tmp = os.statvfs("/opt/ml"), os.statvfs("/tmp")
seen = {
    "size": ml.f_blocks * ml.f_frsize,
    "tmp_on_the_disk": os.stat("/tmp").st_dev == os.stat("/opt/ml").st_dev == os.stat("/var/tmp").st_dev,
}
written, block = 0, b"x" * (8 * 2**20)
try:
    with open("/tmp/fill", "wb") as out:
        while written < 3 * 2**30:  # three times the disk
            out.write(block)
            written += len(block)
        os.fsync(out.fileno())
except OSError as error:
    seen["stopped"] = errno.errorcode[error.errno]
seen["written"] = written
os.remove("/tmp/fill")
with open("/opt/ml/model/disk.json", "w") as model:
    json.dump(seen, model)
"""


def test_a_job_fills_its_own_disk_of_volume_size_and_the_disk_goes_when_the_job_ends(
    server: Server, built: Built
) -> None:
    filler = server.new_account("filler")
    job = _job(server, "fill", built.python, FILL)
    job["ResourceConfig"]["VolumeSizeInGB"] = 1
    server.sagemaker(filler).create_training_job(**job)
    ended = _ended(server, filler, "fill")
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")
    seen = json.loads(_model_files(server, "fill")["disk.json"])
    assert 0.9 * 2**30 < seen["size"] <= 2**30, seen  # /opt/ml is a file system of VolumeSizeInGB
    assert seen["tmp_on_the_disk"] is True  # /tmp and /var/tmp count against it too
    assert seen["stopped"] == "ENOSPC" and seen["written"] <= 2**30, seen
    # The disk went with the job: neither mounted nor on the host's file system.
    jobs = server.work_dir / "jobs"
    assert not [point for point in disks.mounts() if point.is_relative_to(jobs)]
    assert not list(jobs.rglob("*.disk"))


FILL_ROOT = FILL.replace('"/tmp/fill"', '"/var/cache/fill"').replace("3 * 2**30", "4 * 2**30")


def test_what_a_job_writes_into_its_image_s_file_system_fills_the_store_s_disk_not_the_host_s(
    server: Server, built: Built
) -> None:
    assert server.fleet is not None
    store = Path(tomllib.loads(server.fleet.read_text())["backend"]["podman_store"]) / "storage"
    assert disks.is_mounted(store)  # [backend] podman_store_gb: a file system of its own
    writer = server.new_account("layer-filler")
    server.sagemaker(writer).create_training_job(**_job(server, "fill-layer", built.python, FILL_ROOT))
    ended = _ended(server, writer, "fill-layer")
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")
    seen = json.loads(_model_files(server, "fill-layer")["disk.json"])
    assert seen["stopped"] == "ENOSPC" and seen["written"] <= 2 * 2**30, seen
    # The store works on once the file is gone: the next job of the module runs (and so do the others).
    quiet = server.new_account("after-filler")
    server.sagemaker(quiet).create_training_job(
        **_job(server, "after-fill", built.python, "open('/opt/ml/model/ok.txt', 'w').write('ok')")
    )
    assert _ended(server, quiet, "after-fill")["TrainingJobStatus"] == "Completed"


ON_CREATE = """#!/bin/sh
id -u > /root/probe.txt
cat /proc/self/uid_map >> /root/probe.txt
ls /proc | grep -c '^[0-9]' >> /root/probe.txt
"""


def test_a_nodes_lifecycle_script_runs_as_root_in_its_container_and_cannot_read_roots_files(
    server: Server,
) -> None:
    team = server.new_account("node-team")
    script = server.data_dir / "s3" / "lifecycle" / "contained" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    client = server.sagemaker(team)
    client.create_cluster(
        ClusterName="contained",
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": TYPE,
                "InstanceCount": 2,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/contained", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
                "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": 1}}],
            }
        ],
    )

    def running() -> list[dict[str, Any]]:
        nodes = client.list_cluster_nodes(ClusterName="contained")["ClusterNodeSummaries"]
        return [n for n in nodes if n["InstanceStatus"]["Status"] == "Running"]

    nodes = wait_until(lambda: len(found := running()) == 2 and found, timeout=180)
    assert nodes, (client.list_cluster_nodes(ClusterName="contained"), server.log()[-3000:])
    native = server.native(team)
    first, second = (f"/api/v1/clusters/contained/nodes/{n['InstanceId']}/exec" for n in nodes)
    probe = native.post(first, {"Command": ["cat", "/root/probe.txt"]})["Stdout"].split()
    assert probe[0] == "0"  # the lifecycle script ran as root, in the container
    assert probe[1:3] == ["0", probe[2]] and int(probe[2]) >= 2**20  # root there is nobody here
    assert int(probe[4]) <= 4  # its own processes alone (the init, sh, ls, grep)
    # A root-owned 0600 file put into the node's home, from the host: root in the node cannot read it.
    nodes_dir = server.data_dir.parent / "work" / "backend" / "nodes"  # the fixture's --work-dir
    home = nodes_dir / f"node-{nodes[0]['InstanceId']}" / "home"
    assert home.is_dir(), sorted(path.name for path in nodes_dir.iterdir())
    secret = home / "root-only.txt"
    secret.write_text("host root's")
    secret.chmod(0o600)
    answer = native.post(first, {"Command": ["cat", "/root/root-only.txt"]})
    assert answer["ExitCode"] != 0 and "Permission denied" in answer["Stderr"], answer
    # Nor another node's files: its home is nowhere in this one.
    native.post(second, {"Command": ["sh", "-c", "echo second > /root/mine.txt"]})
    other = native.post(first, {"Command": ["sh", "-c", "cat /root/mine.txt; ls / | tr '\\n' ' '"]})
    assert "second" not in other["Stdout"], other
    assert native.post(first, {"Command": ["id", "-u"]})["Stdout"].strip() == "0"  # exec runs in the node
    # Its disk: the group's EBS volume at /opt/sagemaker, its /tmp, /var/tmp and home on it too.
    size, same = native.post(first, {"Command": ["python3", "-c", DISK_PROBE]})["Stdout"].split()
    assert 0.9 * 2**30 < int(size) <= 2**30 and same == "True", (size, same)
    client.delete_cluster(ClusterName="contained")
    gone = wait_until(lambda: not [point for point in disks.mounts() if point.is_relative_to(nodes_dir)])
    assert gone, [point for point in disks.mounts() if point.is_relative_to(nodes_dir)]


DISK_PROBE = """
import os
print(os.statvfs("/opt/sagemaker").f_blocks * os.statvfs("/opt/sagemaker").f_frsize)
disk = os.stat("/opt/sagemaker").st_dev
print(all(os.stat(place).st_dev == disk for place in ("/tmp", "/var/tmp", "/root")))
"""


BOTO3_PROGRAM = """
import os
import boto3
s3 = boto3.client("s3")  # AWS_ENDPOINT_URL and the region come from the job's container
s3.put_object(Bucket="out-from-inside", Key="hello.txt", Body=b"written from the container")
print(sorted(o["Key"] for o in s3.list_objects_v2(Bucket="out-from-inside")["Contents"]))
try:  # a key forged in the container: the server records the refusal under the pod's address
    forged = {"aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": "forged"}
    boto3.client("sagemaker", **forged).list_training_plans()
except Exception as error:
    print("refused:", type(error).__name__)
"""


def test_boto3_in_a_container_reaches_the_endpoint(server: Server, marked_image: str) -> None:
    team = server.new_account("boto3-team")
    keys = {"AWS_ACCESS_KEY_ID": team.access_key, "AWS_SECRET_ACCESS_KEY": team.secret_key}
    job = _job(server, "from-inside", marked_image, BOTO3_PROGRAM, Environment=keys)
    job["OutputDataConfig"]["S3OutputPath"] = "s3://out-from-inside/output"
    server.sagemaker(team).create_training_job(**job)
    ended = _ended(server, team, "from-inside")
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")
    stored = server.data_dir / "s3" / "out-from-inside" / "hello.txt"
    assert stored.read_bytes() == b"written from the container"
    assert "['hello.txt'" in _stdout(server, team, "from-inside")
    assert "refused: ClientError" in _stdout(server, team, "from-inside")
    # The server saw the pod's connections come from an address of the account's own, not the host's.
    trail = server.native().get("/api/v1/audit")["Events"]
    refused = [
        e
        for e in trail
        if e["Action"] == "signature.refused" and team.access_key in e["Detail"].get("AccessKeyIds", [])
    ]
    assert refused, trail
    address = refused[0]["RemoteAddress"]
    assert address.startswith("127.1.") and address != "127.0.0.1", refused
