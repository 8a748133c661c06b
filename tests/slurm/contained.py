"""The Slurm tests in containers (tests/slurm/test_containers.py, and the reclaim, restart and killed
slurmd tests of tests/slurm/test_work.py): a Slurm fleet with its work in containers (runtime podman), a
marked image of the session's registry, and what the tests look at on the host afterwards (the nodes'
files, runc's state, the processes left).

The image (one build per session, tests/slurm/conftest.py) is the session's Python image
(tests/image_fixtures.py) with a file the host lacks, ``MARKER_PATH``, holding a random word, and a
``train`` of its own (``PAIR_TRAIN``): it is the fleet's node image and the jobs' training image, so that
what a program reports of that file shows it ran in the image.
"""

from __future__ import annotations

import io
import json
import pwd
import secrets
import socket
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends import procfs
from tests import processes
from tests.harness import Server, wait_until
from tests.image_fixtures import Built, push_image
from tests.slurm.cluster import Cluster

MARKER_PATH = "/etc/hyperplan-marker"
P5 = "ml.p5.48xlarge"
G5 = "ml.g5.12xlarge"
ON_DEMAND_G5 = ("hp-n05", "hp-n06")
"""The g5 nodes the contained fleet keeps (out of plans: on-demand only); its p5 pool is left to plans."""
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
IMAGE_READY = 180.0
"""How long a server's first node or instance may wait for its image: pulled, then unpacked on the work
root (each test's server has a Podman store of its own, so each pulls it again)."""

# An image's own `train` (no entry point in the job: the image decides), for a job of two instances on
# the nodes' network: each records what it sees, algo-2 sends its record to algo-1 over TCP (by host
# name, across Slurm nodes) and algo-1, whose /opt/ml/model becomes the model artifact, stores both.
PAIR_TRAIN = """#!/usr/bin/python3
import json, os, socket, time

config = json.load(open("/opt/ml/input/config/resourceconfig.json"))
port = int(json.load(open("/opt/ml/input/config/hyperparameters.json"))["port"])
current = config["current_host"]
seen = {
    "marker": open("/etc/hyperplan-marker").read().strip(),
    "data": open("/opt/ml/input/data/train/data.csv").read(),
    "hostname": socket.gethostname(),
    "slurm_node": os.environ.get("SLURMD_NODENAME"),
    "reservation": os.environ.get("SLURM_JOB_RESERVATION"),
    "uid": os.getuid(),
    "addresses": {host: socket.gethostbyname(host) for host in ("algo-1", "algo-2")},
}
if current == "algo-1":
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen()
    listener.settimeout(120)
    peer, _ = listener.accept()
    with peer, peer.makefile("rw") as stream:
        heard = json.loads(stream.readline())
        stream.write("thanks from algo-1\\n")
    with open("/opt/ml/model/result.json", "w") as model:
        json.dump({"algo-1": seen, "algo-2": heard, "answered": "thanks from algo-1"}, model)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            peer = socket.create_connection(("algo-1", port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with peer, peer.makefile("rw") as stream:
        stream.write(json.dumps(seen) + "\\n")
        stream.flush()
        answer = stream.readline().strip()
    if answer != "thanks from algo-1":  # (the job fails)
        raise SystemExit(f"no answer from algo-1: {answer!r}")
"""

# A program that waits to be told to end, for a job that must run while the test does something: each
# instance listens on its own port of ``ports`` (the dev cluster's nodes share the host's network),
# ignores any line but "go" and, on "go", stores the marker as its model and ends.
WAIT_FOR_GO = """#!/usr/bin/python3
import json, socket

config = json.load(open("/opt/ml/input/config/resourceconfig.json"))
ports = json.load(open("/opt/ml/input/config/hyperparameters.json"))["ports"].split(",")
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", int(ports[config["hosts"].index(config["current_host"])])))
listener.listen()
while True:
    peer, _ = listener.accept()
    with peer, peer.makefile() as lines:
        if lines.readline().strip() == "go":
            break
with open("/opt/ml/model/marker.txt", "w") as model:
    model.write(open("/etc/hyperplan-marker").read())
"""
WAIT_FOR_GO_PATH = "/usr/local/bin/wait-for-go"


@dataclass(frozen=True)
class MarkedImage:
    reference: str  # REGISTRY/hyperplan/slurm-marked:1
    marker: str  # what MARKER_PATH holds in it
    registry: str  # 127.0.0.1:PORT, plain HTTP


def build_marked_image(built: Built, tmp_path_factory: pytest.TempPathFactory) -> MarkedImage:
    """The session's Python image with MARKER_PATH (a random word), PAIR_TRAIN as its ``train`` and
    WAIT_FOR_GO, pushed to the session's registry."""
    marker = f"marker-{secrets.token_hex(6)}"
    context = tmp_path_factory.mktemp("slurm-marked-context")
    (context / "marker").write_text(marker + "\n")
    (context / "train").write_text(PAIR_TRAIN)
    (context / "wait-for-go").write_text(WAIT_FOR_GO)
    for program in ("train", "wait-for-go"):
        (context / program).chmod(0o755)
    (context / "Containerfile").write_text(
        f"FROM {built.python}\nCOPY marker {MARKER_PATH}\nCOPY train /usr/local/bin/train\n"
        f"COPY wait-for-go {WAIT_FOR_GO_PATH}\n"
    )
    reference = push_image(built, context, "slurm-marked:1", tmp_path_factory)
    return MarkedImage(reference, marker, built.registry)


def with_containers(
    text: str, store: Path, image: MarkedImage, image_map: Mapping[str, str] | None = None
) -> str:
    """A Slurm fleet's text (the dev cluster's or a variant of it) with its work in containers (runtime
    podman): images pulled into the Podman store ``store`` (no file system of its own), ``image`` the
    nodes' image, its registry plain HTTP, and ``image_map`` (a job's TrainingImage -> a reference) as
    its ``[image_map]``. Nothing else of the fleet changes."""
    assert text.count("[backend]\n") == 1 and "[image_map]" not in text, text
    backend = (
        "[backend]\n"
        'runtime = "podman"\n'
        f'podman_store = "{store}"\n'
        "podman_store_gb = 0\n"
        f'node_image = "{image.reference}"\n'
    )
    text = text.replace("[backend]\n", backend)
    if image_map:
        text += "\n[image_map]\n" + "".join(f'"{key}" = "{target}"\n' for key, target in image_map.items())
    return text + f'\n[registries."{image.registry}"]\ninsecure = true\n'


def contained_fleet(cluster: Cluster, path: Path, store: Path, image: MarkedImage) -> Path:
    """The dev cluster's fleet with its work in containers of ``image`` (:func:`with_containers`). Its p5
    pool is left to plans; its g5 pool is cut to ON_DEMAND_G5, out of plans, for on-demand jobs."""
    text = cluster.fleet.read_text()
    g5_nodes = 'nodes = "hp-n[05-08]"\n'
    assert text.count(g5_nodes) == 1, text
    text = text.replace(g5_nodes, 'nodes = "hp-n[05-06]"\nreservable = 0\n')
    path.write_text(with_containers(text, store, image))
    return path


def work_root(server: Server) -> Path:
    """The work root the server was given (``--work-dir``: the slurm_server fixture's)."""
    args = list(server.extra_args)
    return Path(args[args.index("--work-dir") + 1])


def backend_root(server: Server) -> Path:
    """The Slurm back end's root on the work root: nodes/, tasks/, groups/, images/."""
    return work_root(server) / "slurm"


def created_files(server: Server) -> dict[Path, str]:
    """What each node's OnCreate left in its working directory (the lifecycle scripts' copy in the
    node's home, ``/root/lifecycle`` inside), by path on the host."""
    found = (backend_root(server) / "nodes").glob("*/home/lifecycle/created.txt")
    return {path: path.read_text() for path in found}


def container_states(server: Server) -> list[Path]:
    """runc's state of every container still known under the back end's root (``STATE/NAME`` in each
    node's, task's or group member's ``runc`` directory, which the runner gives ``runc --root``)."""
    root = backend_root(server)
    patterns = ("*/runc/*", "*/*/runc/*", "*/*/*/runc/*")  # tasks/ID, nodes/ID/oncreate, groups/ID/...
    return sorted(
        {state for top in ("nodes", "tasks", "groups") for p in patterns for state in (root / top).glob(p)}
    )


def instance_tree(server: Server, job_name: str, host: str = "algo-1") -> Path | None:
    """Where a job instance's ``/opt/ml`` is on the host (the programs inside see only their own paths):
    the bind in its container's configuration (``oci.json``, written once its image is unpacked) whose
    program has that TRAINING_JOB_NAME and hostname; None while there is none."""
    root = backend_root(server)
    for template in [*root.glob("tasks/*/oci.json"), *root.glob("groups/*/*/oci.json")]:
        config = json.loads(template.read_text())
        if config.get("hostname") == host and f"TRAINING_JOB_NAME={job_name}" in config["process"]["env"]:
            [tree] = [m["source"] for m in config["mounts"] if m["destination"] == "/opt/ml"]
            return Path(tree)
    return None


def nothing_contained_left(server: Server, user: str, timeout: float = 30.0) -> None:
    """No process of the account's user is left running on the host (a container's processes are that
    user's outside) and runc knows no container under the back end's root (a runner that removed its container
    leaves no state behind); waited for, as Slurm's and the runners' ends take real time."""
    uid = pwd.getpwnam(user).pw_uid
    running = lambda: processes.owned_by(uid, zombies=False)  # noqa: E731
    assert wait_until(lambda: not running(), timeout=timeout), running()
    assert wait_until(lambda: not container_states(server), timeout=timeout), container_states(server)


def runner_exits(server: Server) -> dict[str, str]:
    """How the step runners recorded their programs' ends (each ``out/exit.json`` under the back end's
    tasks and groups), by path: what a failure message shows when a job ended otherwise than expected."""
    root = backend_root(server)
    found = [*root.glob("tasks/*/out/exit.json"), *root.glob("groups/*/*/out/exit.json")]
    return {str(path.relative_to(root)): path.read_text() for path in found}


def runc_processes(server: Server) -> list[str]:
    """Command lines of live runc processes whose state is under the back end's root."""
    root = str(backend_root(server))
    found = []
    for pid in procfs.snapshot():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and Path(argv[0]).name == "runc" and any(root in arg for arg in argv):
            found.append(" ".join(argv))
    return found


def contained_job(name: str, image: str, instance_type: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    """A training job of ``image`` (its own ``train`` unless ``extra`` gives an entry point), channel
    ``train`` from s3://bucket/input, its model to s3://bucket/output."""
    algorithm: dict[str, Any] = {"TrainingInputMode": "File", "TrainingImage": image}
    for key in ("ContainerEntrypoint", "ContainerArguments"):
        if key in extra:
            algorithm[key] = extra.pop(key)
    resources: dict[str, Any] = {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 10}
    if "TrainingPlanArn" in extra:
        resources["TrainingPlanArn"] = extra.pop("TrainingPlanArn")
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": algorithm,
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/input"}},
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": resources,
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        **extra,
    }


def put_training_data(server: Server, account: str) -> str:
    """s3://bucket/input/data.csv, the bucket granted to ``account``; the data's text."""
    data = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("x,y\n1,2\n")
    server.cli("buckets", "grant", "bucket", account)
    return data.read_text()


def model_files(server: Server, job: dict[str, Any]) -> dict[str, bytes]:
    """The files of a job's model artifact (model.tar.gz in its output bucket), by name."""
    bucket, _, key = job["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("s3://").partition("/")
    archive = server.data_dir / "s3" / bucket / key
    with tarfile.open(fileobj=io.BytesIO(archive.read_bytes())) as tar:
        return {
            member.name.removeprefix("./"): tar.extractfile(member).read()  # type: ignore[union-attr]
            for member in tar.getmembers()
            if member.isfile()
        }


def say(port: int, line: str, timeout: float = 60) -> bool:
    """Send ``line`` to a program listening on loopback ``port`` (the nodes' network is the host's on
    the dev cluster), trying until it listens; whether it was sent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as peer:
                peer.sendall(line.encode() + b"\n")
                return True
        except OSError:
            time.sleep(0.3)
    return False
